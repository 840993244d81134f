// The C interface's symmetric memory: a SymmetricBuffer and a SignalPad on one communicator, for
// kernels of the caller's own (asynctp/c_api.h, docs/reference/symmetric_memory.md).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "asynctp/signal.h"
#include "asynctp/symmetric.h"
#include "capi/handles.h"
#include "common/device_fault.h"
#include "ops/cross_rank_check.h"

struct asynctp_symmetric {
  asynctp_comm* owner = nullptr;
  std::unique_ptr<asynctp::SymmetricBuffer> buffer;
  std::unique_ptr<asynctp::SignalPad> pad;
};

using namespace asynctp::capi;  // NOLINT: the extern "C" functions below are not in a namespace

namespace {

static_assert(sizeof(asynctp_wait_context) == sizeof(asynctp::device::WaitContext) &&
                  offsetof(asynctp_wait_context, timeout_ns) == offsetof(asynctp::device::WaitContext, timeout_ns) &&
                  offsetof(asynctp_wait_context, rank) == offsetof(asynctp::device::WaitContext, rank),
              "asynctp_wait_context is laid out as asynctp::device::WaitContext");
// The Python package reads asynctp_symmetric_info with these offsets (python/asynctp/_lib.py).
static_assert(offsetof(asynctp_symmetric_info, wait) == 56 && sizeof(asynctp_symmetric_info) == 80,
              "asynctp_symmetric_info changed layout: change the C API version and _lib.SymmetricInfo");

// A live symmetric handle and its live communicator, held for the length of one call.
struct SymmetricUse : Held<asynctp_symmetric> {
  SymmetricUse(const asynctp_symmetric* s, const char* function)
      : Held(symmetrics(), s, function, "sym", "symmetric memory handle"),
        comm_use((*this)->owner, function),
        function_(function) {}
  CommUse comm_use;
  asynctp::Communicator& comm() const { return comm_use.comm(); }
  asynctp::SymmetricBuffer& buffer() const { return *(*this)->buffer; }
  asynctp::SignalPad& pad() const { return *(*this)->pad; }

  void check_rank(int rank, const char* argument) const {
    const int ws = comm().world_size();
    if (rank < 0 || rank >= ws) raise(cat(function_, ": ", argument, " is ", rank, "; expected 0 to ", ws - 1));
  }
  void check_flag(int index) const {
    const int n = pad().count();
    if (index < 0 || index >= n) raise(cat(function_, ": index is ", index, "; expected 0 to ", n - 1));
  }
  const char* function_;
};

}  // namespace

extern "C" {

int asynctp_symmetric_create(asynctp_comm* comm, uint64_t bytes, int signal_count, asynctp_symmetric** sym) {
  return guarded([&] {
    const char* fn = "asynctp_symmetric_create";
    if (sym == nullptr) raise(cat(fn, ": sym (the result) is NULL"));
    *sym = nullptr;
    const CommUse use(comm, fn);
    asynctp::Communicator& c = use.comm();
    // Every rank checks, then the ranks agree, before any collective allocation: a rank that refuses
    // (or asks for another size) fails every rank at once instead of leaving them in the allocation.
    std::string refusal;
    if (bytes == 0) {
      refusal = cat(fn, ": bytes is 0; expected > 0");
    } else if (bytes > static_cast<uint64_t>(INT64_MAX)) {
      refusal = cat(fn, ": bytes is ", bytes, "; expected at most 2^63 - 1");
    } else if (signal_count <= 0) {
      refusal = cat(fn, ": signal_count is ", signal_count, "; expected > 0");
    } else if (c.lsa().size != c.world_size()) {
      refusal = cat(fn, ": every rank must reach every other's memory (one node); this communicator has ",
                    c.world_size(), " ranks but an NVLink/P2P team of ", c.lsa().size);
    }
    asynctp::ops::Signature signature;
    signature.add("bytes", static_cast<int64_t>(bytes));
    signature.add("signal_count", signal_count);
    asynctp::ops::agree_across_ranks(c, "symmetric memory", signature, refusal, nullptr);
    auto made = std::make_unique<asynctp_symmetric>();
    made->owner = comm;
    made->buffer = asynctp::SymmetricBuffer::create(c, static_cast<size_t>(bytes));
    made->pad = asynctp::SignalPad::create(c, signal_count);
    symmetrics().add(made.get());
    ++comm->symmetrics;
    *sym = made.release();
  });
}

int asynctp_symmetric_destroy(asynctp_symmetric* sym) {
  return guarded([&] {
    const char* fn = "asynctp_symmetric_destroy";
    if (sym == nullptr) return;
    asynctp_comm* owner = nullptr;
    {
      const SymmetricUse use(sym, fn);
      owner = use->owner;
    }
    if (symmetrics().remove(sym, fn, "sym", "symmetric memory handle")) {
      delete sym;
      --owner->symmetrics;
    }
  });
}

int asynctp_symmetric_get_info(const asynctp_symmetric* sym, asynctp_symmetric_info* info) {
  return guarded([&] {
    const char* fn = "asynctp_symmetric_get_info";
    if (info == nullptr) raise(cat(fn, ": info (the result) is NULL"));
    const SymmetricUse use(sym, fn);
    asynctp::Communicator& c = use.comm();
    asynctp_symmetric_info out;
    std::memset(&out, 0, sizeof out);
    out.buffer = use.buffer().local();
    out.bytes = use.buffer().size();
    out.buffer_ptrs_dev = const_cast<void**>(use.buffer().device_peers());
    out.signal_pad = use.pad().local();
    out.signal_pad_ptrs_dev = const_cast<uint32_t**>(use.pad().device_peers());
    out.signal_count = use.pad().count();
    out.rank = c.rank();
    out.world_size = c.world_size();
    out.wait.fault = asynctp::detail::device_fault_record();
    out.wait.timeout_ns = static_cast<uint64_t>(c.timeout_ms()) * 1000000ull;
    out.wait.rank = c.rank();
    *info = out;
  });
}

int asynctp_symmetric_peer(const asynctp_symmetric* sym, int rank, void** buffer, uint32_t** signal_pad) {
  return guarded([&] {
    const SymmetricUse use(sym, "asynctp_symmetric_peer");
    use.check_rank(rank, "rank");
    // This rank's own are the pointers it allocated: NCCL maps its window a second time for the
    // device arrays, and a tensor or an op that matches addresses knows the first.
    const bool own = rank == use.comm().rank();
    if (buffer != nullptr) *buffer = own ? use.buffer().local() : use.buffer().peer(rank);
    if (signal_pad != nullptr) *signal_pad = own ? use.pad().local() : use.pad().peer(rank);
  });
}

int asynctp_symmetric_put_signal(asynctp_symmetric* sym, int owner, int index, uint32_t value, void* stream) {
  return guarded([&] {
    const SymmetricUse use(sym, "asynctp_symmetric_put_signal");
    use.check_rank(owner, "owner");
    use.check_flag(index);
    use.pad().set(static_cast<cudaStream_t>(stream), owner, index, value);
  });
}

int asynctp_symmetric_wait_signal(asynctp_symmetric* sym, int owner, int index, uint32_t value, void* stream) {
  return guarded([&] {
    const SymmetricUse use(sym, "asynctp_symmetric_wait_signal");
    use.check_rank(owner, "owner");
    use.check_flag(index);
    use.pad().wait(static_cast<cudaStream_t>(stream), owner, index, value, asynctp::WaitMode::kBounded);
  });
}

int asynctp_symmetric_barrier(asynctp_symmetric* sym, void* stream) {
  return guarded([&] {
    const SymmetricUse use(sym, "asynctp_symmetric_barrier");
    use.comm().barrier(static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
