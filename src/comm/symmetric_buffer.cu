// SymmetricBuffer: memory every rank allocates at once and addresses on each other, through the
// communicator's transport (comm/transport.h).
#include <algorithm>

#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp {

std::unique_ptr<SymmetricBuffer> SymmetricBuffer::create(Communicator& comm, size_t bytes) {
  const detail::RankScope scope(comm.rank());
  ASYNCTP_CHECK(bytes > 0, "SymmetricBuffer::create: bytes must be > 0");
  Communicator::Impl& m = impl_of(comm);
  m.require_usable("SymmetricBuffer::create");
  std::unique_ptr<SymmetricBuffer> buf(new SymmetricBuffer());
  buf->comm_ = &comm;
  comm::SymmetricMapping mapping = m.transport->map_symmetric(bytes);
  buf->local_ = mapping.local;
  buf->size_ = mapping.bytes;
  buf->window_ = mapping.window;
  buf->peers_ = std::move(mapping.peers);
  buf->device_peers_ = mapping.device_peers;
  buf->serial_ = ++m.symmetric_buffers_made;
  m.symmetric_buffers.push_back(buf.get());
  return buf;
}

SymmetricBuffer::~SymmetricBuffer() {
  Communicator::Impl& m = impl_of(*comm_);
  const detail::RankScope scope(m.rank);
  auto& live = m.symmetric_buffers;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
  cudaSetDevice(m.device);
  if (cudaDeviceSynchronize() != cudaSuccess) return;  // the context is gone; see ~Communicator
  // No rank may free its part while a peer's work can still reach it: every rank has drained its own
  // GPU work (above); the exchange below holds each rank until all have.
  try {
    (void)m.failing_ranks(true);
  } catch (const std::exception&) {
    return;
  }
  comm::SymmetricMapping mapping;
  mapping.local = local_;
  mapping.bytes = size_;
  mapping.window = window_;
  mapping.device_peers = device_peers_;
  m.transport->unmap_symmetric(mapping);
}

void* SymmetricBuffer::peer(int lsa_rank) const {
  const detail::RankScope scope(comm_->rank());
  ASYNCTP_CHECK(lsa_rank >= 0 && lsa_rank < lsa_size(), "SymmetricBuffer::peer: lsa_rank must be in [0, ", lsa_size(),
                "), got ", lsa_rank);
  return peers_[lsa_rank];
}

}  // namespace asynctp

namespace asynctp {

const SymmetricBuffer* Communicator::Impl::find_symmetric(const void* p, size_t bytes) const {
  const auto* begin = static_cast<const char*>(p);
  for (const SymmetricBuffer* buf : symmetric_buffers) {
    const auto* local = static_cast<const char*>(buf->local());
    if (begin >= local && begin + bytes <= local + buf->size()) return buf;
  }
  return nullptr;
}

}  // namespace asynctp
