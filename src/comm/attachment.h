// Internal: per-communicator state that a layer above comm keeps in the communicator (the algorithms'
// streams, flags and GEMM plans, auto's choices, the NaN scan's buffers), so that comm holds it
// without knowing its type.
#pragma once

namespace asynctp::comm {

class Attachment {
 public:
  virtual ~Attachment() = default;
  // Called once as the communicator goes, before its own resources, newest attachment first; the
  // attachment is destroyed right after. `healthy`: the GPU context works and the peers are in step,
  // so device memory and collective resources are freed; otherwise they are left to the dying process
  // (a free can wait for a device that never goes idle, or for a peer that is gone).
  virtual void detach(bool healthy) = 0;
};

// One address per attachment type (an inline variable has one address in the whole program), by which
// the communicator finds it.
template <typename T>
struct AttachmentTag {
  static constexpr char id = 0;
};
template <typename T>
const void* attachment_tag() {
  return &AttachmentTag<T>::id;
}

}  // namespace asynctp::comm
