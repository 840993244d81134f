#include "tune/fit.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "asynctp/error.h"
#include "tune/flat_json.h"

namespace asynctp::tune {
namespace {

struct Line {
  double slope = 0, intercept = 0;
  bool ok = false;
};

// Least squares y = slope * x + intercept.
Line fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  Line l;
  if (n < 2) return l;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  const double d = n * sxx - sx * sx;
  if (std::fabs(d) < 1e-30) return l;
  l.slope = (n * sxy - sx * sy) / d;
  l.intercept = (sy - l.slope * sx) / n;
  l.ok = l.slope > 0;
  return l;
}

}  // namespace

std::string problem_key_text(const ProblemKey& k) {
  std::ostringstream s;
  s << op_key(k.op) << " " << k.M << " " << k.N << " " << k.K << " " << dtype_name(k.dtype)
    << " " << (k.last_dim ? "last" : "0") << " " << k.world_size << " " << k.gpu;
  return s.str();
}

std::map<std::string, Measured> read_measured(const std::string& path) {
  std::map<std::string, Measured> out;
  std::ifstream in(path);
  if (!in) return out;
  std::stringstream all;
  all << in.rdbuf();
  TuningCache validated;  // every line as auto will read it, errors naming the line
  validated.add_text(all.str(), path);
  std::string line;
  while (std::getline(all, line)) {
    FlatObject o;
    std::string error;
    if (!parse_flat_object(line, o, error) || o["kind"].text != "choice") continue;
    Measured m;
    m.key.op = o["op"].text == "rs" ? Op::kMatmulReduceScatter : Op::kAllGatherMatmul;
    m.key.M = static_cast<int64_t>(o["M"].number), m.key.N = static_cast<int64_t>(o["N"].number);
    m.key.K = static_cast<int64_t>(o["K"].number);
    parse_dtype(o["dtype"].text, m.key.dtype);  // validated above
    m.key.last_dim = o["dim"].text == "last";
    m.key.world_size = static_cast<int>(o["world_size"].number);
    m.key.gpu = o["gpu"].text;
    m.gemm_us = o["gemm_alone_us"].number, m.comm_us = o["comm_alone_us"].number;
    m.sequential_us = o["sequential_us"].number, m.overlapped_us = o["overlapped_us"].number;
    out[problem_key_text(m.key)] = m;
  }
  return out;
}

std::string drop_truncated_last_line(const std::string& path) {
  std::string body;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";
    std::ostringstream all;
    all << in.rdbuf();
    body = all.str();
  }
  if (body.empty() || body.back() == '\n') return "";
  const size_t start = body.rfind('\n') == std::string::npos ? 0 : body.rfind('\n') + 1;
  const std::string last = body.substr(start);
  FlatObject o;
  std::string error;
  if (parse_flat_object(last, o, error)) {
    std::ofstream(path, std::ios::app) << "\n";
    return "";
  }
  std::error_code ec;
  std::filesystem::resize_file(path, start, ec);
  if (ec) throw Error("asynctp-tune: could not cut the truncated last line off " + path + ": " + ec.message());
  return last;
}

Rates fit_rates(const std::vector<Measured>& shapes) {
  Rates r;
  if (shapes.size() < 2) return r;
  std::vector<double> flops, gemm, bytes, comm;
  for (const Measured& m : shapes) {
    // estimate() with unit rates and no fixed costs gives FLOPs / 1e6 and bytes / 1e3.
    Rates unit;
    unit.gemm_tflops = unit.copy_gbps = unit.nccl_gbps = 1;
    unit.gemm_fixed_us = unit.nccl_fixed_us = 0;
    const Estimate e = estimate(m.key, unit);
    flops.push_back(e.gemm_us), gemm.push_back(m.gemm_us);
    bytes.push_back(e.copy_us), comm.push_back(m.comm_us);
  }
  const Line g = fit_line(flops, gemm), c = fit_line(bytes, comm);
  if (g.ok) r.gemm_tflops = 1 / g.slope, r.gemm_fixed_us = std::max(0.0, g.intercept);
  if (c.ok) r.nccl_gbps = r.copy_gbps = 1 / c.slope, r.nccl_fixed_us = std::max(0.0, c.intercept);
  std::vector<double> excess;
  for (const Measured& m : shapes) {
    if (m.overlapped_us <= 0) continue;
    Rates no_fixed = r;
    no_fixed.overlap_fixed_us = 0;
    excess.push_back(m.overlapped_us - estimate(m.key, no_fixed).overlapped_us);
  }
  if (!excess.empty()) {
    std::sort(excess.begin(), excess.end());
    r.overlap_fixed_us = std::max(0.0, excess[std::min(excess.size() - 1, excess.size() * 3 / 4)]);
  }
  return r;
}

}  // namespace asynctp::tune
