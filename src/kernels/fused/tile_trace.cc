// The host side of the tile trace (tile_trace.h): the buffer the kernel writes, and the CSV file.
#include "kernels/fused/tile_trace.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/check.h"
#include "common/env.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/tail_split.h"

namespace asynctp::kernels::fused {
namespace {

const char* trace_dir() {
  static const std::string dir = [] {
    const std::string d = detail::knob_text(detail::Knob::kTraceTiles);
    // Made here so that a run need not prepare it; a folder that cannot be made is reported by the
    // first write into it, which names the path.
    std::error_code ignored;
    if (!d.empty()) std::filesystem::create_directories(d, ignored);
    return d;
  }();
  return dir.empty() ? nullptr : dir.c_str();
}

// Records a launch can write: kTraceCtasPerCluster per unit of work (tile_trace.cuh), and at most a
// unit per tile of the narrowest kind (128 x 128, in one-CTA clusters), each split kMaxTailSplits ways.
size_t records_for(const FusedGemmArgs& a) {
  const int64_t tiles = (a.M + kTileRows - 1) / kTileRows * ((a.N + kOneRowTileN - 1) / kOneRowTileN);
  return static_cast<size_t>(tiles * kMaxTailSplits * kTraceCtasPerCluster);
}

struct TraceBuffer {
  std::mutex mu;
  uint64_t* device = nullptr;
  size_t words = 0;
};

TraceBuffer& buffer() {
  // One per thread: a process runs one rank, or (in-process groups) one rank per thread, each on one
  // device. The buffer stays for the thread's life; tracing is for measurement runs only.
  thread_local TraceBuffer b;
  return b;
}

std::string trace_path(const char* op, const FusedGemmArgs& args, int rank, const char* ext) {
  std::ostringstream path;
  path << trace_dir() << '/' << op << '_' << args.M << 'x' << args.N << 'x' << args.K << "_rank" << rank << ext;
  return path.str();
}

}  // namespace

uint64_t* tile_trace_buffer(const FusedGemmArgs& args, cudaStream_t stream) {
  if (trace_dir() == nullptr) return nullptr;
  TraceBuffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  const size_t words = records_for(args) * kTraceWords;
  if (words > b.words) {
    // The previous call synchronized before writing its file, so no kernel still uses the old buffer.
    if (b.device != nullptr) ASYNCTP_CUDA_CHECK(cudaFree(b.device));
    b.device = nullptr;
    ASYNCTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b.device), words * sizeof(uint64_t)));
    b.words = words;
  }
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(b.device, 0, words * sizeof(uint64_t), stream));
  return b.device;
}

namespace {

std::vector<uint64_t> read_records(const FusedGemmArgs& args) {
  std::vector<uint64_t> r(records_for(args) * kTraceWords);
  ASYNCTP_CUDA_CHECK(cudaMemcpy(r.data(), args.trace, r.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  return r;
}

// A record the launch wrote: its unit word always has the split count (at least 1) in it.
bool written(const uint64_t* w) { return w[kTraceUnit] != 0; }

// The start of the CTA that wrote record `w`: in the record of that CTA's first unit, which is its
// cluster's index (units are dealt to the clusters in turn).
uint64_t cta_start(const std::vector<uint64_t>& r, size_t record) {
  const uint64_t cluster = r[record * kTraceWords + kTraceUnit] >> 32;
  return r[(cluster * kTraceCtasPerCluster + record % kTraceCtasPerCluster) * kTraceWords + kTraceStart];
}

TileTraceSpan span_of(const std::vector<uint64_t>& r) {
  TileTraceSpan span;
  span.first_start_ns = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < r.size(); i += kTraceWords) {
    if (!written(&r[i])) continue;  // a unit this launch did not have
    span.first_start_ns = std::min(span.first_start_ns, cta_start(r, i / kTraceWords));
    span.last_epilogue_ns = std::max(span.last_epilogue_ns, r[i + kTraceEpilogueDone]);
  }
  return span;
}

}  // namespace

TileTraceSpan tile_trace_span(const FusedGemmArgs& args) {
  return args.trace == nullptr ? TileTraceSpan{} : span_of(read_records(args));
}

void write_tile_trace(const char* op, const FusedGemmArgs& args, int rank) {
  if (args.trace == nullptr) return;
  const std::vector<uint64_t> r = read_records(args);
  const uint64_t t0 = span_of(r).first_start_ns;
  const std::string path = trace_path(op, args, rank, ".csv");
  std::ofstream out(path);
  ASYNCTP_CHECK(out.good(), "ASYNCTP_TRACE_TILES: cannot write ", path);
  out << "unit,cta,cluster,m_tile,n_tile,staged,split,splits,start_ns,fixup_enter_ns,wait_done_ns,fixup_exit_ns,"
         "epilogue_done_ns,producer_start_ns\n";
  auto rel = [&](uint64_t t) { return t == 0 ? int64_t{-1} : static_cast<int64_t>(t - t0); };
  for (size_t i = 0; i < r.size(); i += kTraceWords) {
    const uint64_t* w = &r[i];
    if (!written(w)) continue;  // a unit this launch did not have
    const size_t record = i / kTraceWords;
    out << record / kTraceCtasPerCluster << ',' << record % kTraceCtasPerCluster << ',' << (w[kTraceUnit] >> 32) << ','
        << (w[kTraceTile] >> 32) << ',' << (w[kTraceTile] & 0xFFFFFFFFu) << ',' << (w[kTraceUnit] & 1) << ','
        << ((w[kTraceUnit] >> 16) & 0xFFFF) << ',' << ((w[kTraceUnit] >> 1) & 0x7FFF) << ',' << rel(cta_start(r, record))
        << ',' << rel(w[kTraceFixupEnter]) << ',' << rel(w[kTraceWaitDone]) << ',' << rel(w[kTraceFixupExit]) << ','
        << rel(w[kTraceEpilogueDone]) << ',' << rel(w[kTraceProducerStart]) << '\n';
  }
}

constexpr int kMaxMarks = 12;

struct CallTimeline::Mark {
  const char* name = nullptr;
  cudaEvent_t event = nullptr;
  std::chrono::steady_clock::time_point host;
};

namespace {
// When the public op that made the current call was entered (note_op_entry), on this thread.
thread_local std::chrono::steady_clock::time_point op_entry;
}  // namespace

void CallTimeline::note_op_entry() {
  if (trace_dir() != nullptr) op_entry = std::chrono::steady_clock::now();
}

CallTimeline::CallTimeline(cudaStream_t stream) : stream_(stream) {
  if (trace_dir() == nullptr) return;
  marks_ = new Mark[kMaxMarks];
  // Made before the first mark, so that a mark costs the host one event record, not a creation too.
  for (int i = 0; i < kMaxMarks; ++i) ASYNCTP_CUDA_CHECK(cudaEventCreate(&marks_[i].event));
}

CallTimeline::~CallTimeline() {
  if (marks_ == nullptr) return;
  for (int i = 0; i < kMaxMarks; ++i) cudaEventDestroy(marks_[i].event);
  delete[] marks_;
}

void CallTimeline::mark(const char* name) {
  if (marks_ == nullptr || count_ == kMaxMarks) return;
  Mark& m = marks_[count_++];
  m.name = name;
  m.host = std::chrono::steady_clock::now();  // before the record: a host interval holds the previous mark's record
  ASYNCTP_CUDA_CHECK(cudaEventRecord(m.event, stream_));
}

void CallTimeline::write(const char* op, const FusedGemmArgs& args, int rank) {
  if (marks_ == nullptr || count_ == 0) return;
  const std::string path = trace_path(op, args, rank, ".calls");
  std::ofstream out(path);
  ASYNCTP_CHECK(out.good(), "ASYNCTP_TRACE_TILES: cannot write ", path);
  out << "mark gpu_us host_us\n";
  out << "op_entry - " << std::chrono::duration<double, std::micro>(op_entry - marks_[0].host).count() << '\n';
  for (int i = 0; i < count_; ++i) {
    float ms = 0;
    ASYNCTP_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[0].event, marks_[i].event));
    out << marks_[i].name << ' ' << ms * 1000.0f << ' '
        << std::chrono::duration<double, std::micro>(marks_[i].host - marks_[0].host).count() << '\n';
  }
}

}  // namespace asynctp::kernels::fused
