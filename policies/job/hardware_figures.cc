#include "policies/job/hardware_figures.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file.h"

namespace strata::policies {
namespace {

using nlohmann::json;

// Linear interpolation of y over log(x) between sorted (x, y) points;
// clamped at both ends.
double InterpolateLog(const std::vector<std::pair<double, double>>& points, double x) {
  if (points.size() == 1 || x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (size_t i = 1; i < points.size(); ++i) {
    if (x <= points[i].first) {
      const double a = std::log(points[i - 1].first), b = std::log(points[i].first);
      const double t = (std::log(x) - a) / (b - a);
      return points[i - 1].second + t * (points[i].second - points[i - 1].second);
    }
  }
  return points.back().second;
}

json PointsJson(const std::vector<MatmulPoint>& points) {
  json out = json::array();
  for (const auto& p : points) out.push_back({{"m", p.m}, {"k", p.k}, {"flops", p.flops}});
  return out;
}

}  // namespace

const HardwareFigures::Rows& HardwareFigures::RowsOf(const std::string& dtype) const {
  const bool bf16 = dtype == "bf16" && !matmul_bf16.empty();
  Rows& rows = bf16 ? bf16_rows_ : fp32_rows_;
  if (!rows.by_k.empty()) return rows;
  std::map<int64_t, std::vector<std::pair<double, double>>> by_k;
  for (const auto& p : bf16 ? matmul_bf16 : matmul_fp32) by_k[p.k].push_back({static_cast<double>(p.m), p.flops});
  for (auto& [k, row] : by_k) {
    std::sort(row.begin(), row.end());
    rows.by_k.push_back({static_cast<double>(k), std::move(row)});
  }
  return rows;
}

double HardwareFigures::MatmulSeconds(int64_t m, int64_t k, int64_t n, const std::string& dtype) const {
  const Rows& rows = RowsOf(dtype);
  if (rows.by_k.empty() || m <= 0 || k <= 0 || n <= 0) return op_overhead_s;
  // At each measured k: time is linear in m between measured m (a fixed
  // part, reading the weights, plus arithmetic that grows with m), and the
  // rate constant beyond the ends. Then the rate is interpolated over log k.
  const double x = static_cast<double>(m);
  std::vector<std::pair<double, double>> over_k;
  over_k.reserve(rows.by_k.size());
  for (const auto& [kk, row] : rows.by_k) {
    double rate = row.back().second;
    if (x <= row.front().first) {
      rate = row.front().second;
    } else {
      for (size_t i = 1; i < row.size(); ++i) {
        if (x <= row[i].first) {
          const double t0 = row[i - 1].first / row[i - 1].second, t1 = row[i].first / row[i].second;
          const double t = t0 + (x - row[i - 1].first) / (row[i].first - row[i - 1].first) * (t1 - t0);
          rate = x / t;
          break;
        }
      }
    }
    over_k.push_back({kk, rate});
  }
  const double rate = InterpolateLog(over_k, static_cast<double>(k));
  return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) / rate + op_overhead_s;
}

double HardwareFigures::NvmeAdamParamsPerSecond() const {
  if (nvme_adam_params_per_s > 0) return nvme_adam_params_per_s;
  const double disk_s = 12.0 / nvme_read_bytes_per_s + 12.0 / nvme_write_bytes_per_s;
  return std::min(adam_params_per_s, 1.0 / disk_s);
}

double HardwareFigures::LargeMatmulFlops() const {
  return 2.0 * 1024 * 4096 * 4096 / MatmulSeconds(1024, 4096, 4096, "fp32");
}

double HardwareFigures::HostMatmulFlops() const {
  return host_matmul_flops_per_s > 0 ? host_matmul_flops_per_s : LargeMatmulFlops();
}

double HardwareFigures::BlockedAttentionFlops(int64_t head_dim) const {
  if (blocked_attention_flops_per_s <= 0) {
    const HardwareFigures built_in = BuiltInHardwareFigures();
    return LargeMatmulFlops() * built_in.BlockedAttentionFlops(head_dim) / built_in.LargeMatmulFlops();
  }
  if (blocked_attention_d128_flops_per_s <= 0) return blocked_attention_flops_per_s;
  const double at = std::clamp(std::log2(static_cast<double>(std::max<int64_t>(head_dim, 1))), 6.0, 7.0) - 6.0;
  return blocked_attention_flops_per_s + at * (blocked_attention_d128_flops_per_s - blocked_attention_flops_per_s);
}

std::string HardwareFigures::ToJson() const {
  json j{{"machine", machine},
         {"matmul_fp32", PointsJson(matmul_fp32)},
         {"matmul_bf16", PointsJson(matmul_bf16)},
         {"op_overhead_s", op_overhead_s},
         {"layer_overhead_s", layer_overhead_s},
         {"decode_step_overhead_s", decode_step_overhead_s},
         {"memory_copy_bytes_per_s", memory_copy_bytes_per_s},
         {"host_stream_bytes_per_s", host_stream_bytes_per_s},
         {"nvme_stream_bytes_per_s", nvme_stream_bytes_per_s},
         {"nvme_read_bytes_per_s", nvme_read_bytes_per_s},
         {"nvme_write_bytes_per_s", nvme_write_bytes_per_s},
         {"adam_params_per_s", adam_params_per_s},
         {"device_adam_params_per_s", device_adam_params_per_s},
         {"allreduce_bytes_per_s", allreduce_bytes_per_s},
         {"process_baseline_bytes", process_baseline_bytes}};
  if (nvme_adam_params_per_s > 0) j["nvme_adam_params_per_s"] = nvme_adam_params_per_s;
  if (host_matmul_flops_per_s > 0) j["host_matmul_flops_per_s"] = host_matmul_flops_per_s;
  if (blocked_attention_flops_per_s > 0) j["blocked_attention_flops_per_s"] = blocked_attention_flops_per_s;
  if (blocked_attention_d128_flops_per_s > 0) {
    j["blocked_attention_d128_flops_per_s"] = blocked_attention_d128_flops_per_s;
  }
  return j.dump(2) + "\n";
}

HardwareFigures BuiltInHardwareFigures() {
  // `strata bench figures` on the 2-vCPU development machine, 2026-11-24
  // (docs/BENCHMARKS.md): what `strata plan` assumes without a figures file.
  HardwareFigures f;
  f.machine = "built in: the 2-vCPU development machine (run `strata bench figures` for yours)";
  f.matmul_fp32 = {{1, 256, 5.273e+09},    {2, 256, 1.069e+10},     {4, 256, 2.507e+10},    {16, 256, 8.6e+10},
                   {64, 256, 1.511e+11},   {256, 256, 1.346e+11},   {1024, 256, 1.365e+11}, {1, 1024, 8.998e+09},
                   {2, 1024, 1.576e+10},   {4, 1024, 2.599e+10},    {16, 1024, 9.314e+10},  {64, 1024, 1.606e+11},
                   {256, 1024, 1.747e+11}, {1024, 1024, 1.812e+11}, {1, 4096, 6.954e+09},   {2, 4096, 1.306e+10},
                   {4, 4096, 2.22e+10},    {16, 4096, 8.442e+10},   {64, 4096, 1.54e+11},   {256, 4096, 1.955e+11},
                   {1024, 4096, 2.065e+11}};
  f.matmul_bf16 = {{1, 256, 5.322e+09},    {2, 256, 1.046e+10},     {4, 256, 2.035e+10},    {16, 256, 6.746e+10},
                   {64, 256, 1.445e+11},   {256, 256, 2.007e+11},   {1024, 256, 2.205e+11}, {1, 1024, 9.754e+09},
                   {2, 1024, 1.928e+10},   {4, 1024, 3.558e+10},    {16, 1024, 9.717e+10},  {64, 1024, 1.726e+11},
                   {256, 1024, 2.122e+11}, {1024, 1024, 2.175e+11}, {1, 4096, 7.743e+09},   {2, 4096, 1.525e+10},
                   {4, 4096, 2.854e+10},   {16, 4096, 8.345e+10},   {64, 4096, 1.605e+11},  {256, 4096, 2.081e+11},
                   {1024, 4096, 2.042e+11}};
  f.op_overhead_s = 5.61e-07;
  f.layer_overhead_s = 0.0001295;
  f.decode_step_overhead_s = 0.0001771;
  f.memory_copy_bytes_per_s = 1.456e+10;
  f.host_stream_bytes_per_s = 1.27e+10;
  f.nvme_stream_bytes_per_s = 1.224e+09;
  f.nvme_read_bytes_per_s = 1.825e+09;
  f.nvme_write_bytes_per_s = 4.579e+09;
  f.adam_params_per_s = 2.205e+09;
  f.device_adam_params_per_s = 3.242e+08;
  f.nvme_adam_params_per_s = 1.428e+08;
  f.host_matmul_flops_per_s = 1.446e+11;
  // Measured later (2026-11-28, a 2-vCPU AMD EPYC): 48.4 GFLOP/s over the
  // visible scores, 60.4 over those the blocks compute (1.249 times as
  // many at 1k tokens), 0.335 of that machine's large fp32 product; the
  // same share of this one's.
  f.blocked_attention_flops_per_s = 6.92e+10;
  f.allreduce_bytes_per_s = 1.529e+09;
  f.process_baseline_bytes = 180682752;
  return f;
}

absl::StatusOr<HardwareFigures> ParseHardwareFigures(const std::string& text, const std::string& source) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a JSON object (write one with `strata bench figures`)"));
  }
  HardwareFigures f;
  f.source = source;
  auto bad = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field '", field, "' ", why));
  };
  auto number = [&](const char* field, double* out) -> absl::Status {
    if (!j.contains(field) || !j[field].is_number() || !(j[field].get<double>() > 0)) {
      return bad(field, "is missing or not a positive number");
    }
    *out = j[field].get<double>();
    return absl::OkStatus();
  };
  auto points = [&](const char* field, std::vector<MatmulPoint>* out) -> absl::Status {
    if (!j.contains(field) || !j[field].is_array() || j[field].empty()) {
      return bad(field, "is missing or not a non-empty array of {m, k, flops}");
    }
    for (const auto& p : j[field]) {
      if (!p.is_object() || !p.contains("m") || !p.contains("k") || !p.contains("flops") || !p["m"].is_number() ||
          !p["k"].is_number() || !p["flops"].is_number() || p["m"].get<double>() < 1 || p["k"].get<double>() < 1 ||
          !(p["flops"].get<double>() > 0)) {
        return bad(field, "has an entry that is not {m >= 1, k >= 1, flops > 0}");
      }
      out->push_back({p["m"].get<int64_t>(), p["k"].get<int64_t>(), p["flops"].get<double>()});
    }
    return absl::OkStatus();
  };
  if (j.contains("machine") && j["machine"].is_string()) f.machine = j["machine"].get<std::string>();
  absl::Status s = points("matmul_fp32", &f.matmul_fp32);
  if (s.ok()) s = points("matmul_bf16", &f.matmul_bf16);
  if (s.ok()) s = number("op_overhead_s", &f.op_overhead_s);
  if (s.ok()) s = number("layer_overhead_s", &f.layer_overhead_s);
  if (s.ok()) s = number("decode_step_overhead_s", &f.decode_step_overhead_s);
  if (s.ok()) s = number("memory_copy_bytes_per_s", &f.memory_copy_bytes_per_s);
  if (s.ok()) s = number("host_stream_bytes_per_s", &f.host_stream_bytes_per_s);
  if (s.ok()) s = number("nvme_stream_bytes_per_s", &f.nvme_stream_bytes_per_s);
  if (s.ok()) s = number("nvme_read_bytes_per_s", &f.nvme_read_bytes_per_s);
  if (s.ok()) s = number("nvme_write_bytes_per_s", &f.nvme_write_bytes_per_s);
  if (s.ok()) s = number("adam_params_per_s", &f.adam_params_per_s);
  if (s.ok()) s = number("device_adam_params_per_s", &f.device_adam_params_per_s);
  // Optional: files from before it was measured lack it (derived then).
  if (s.ok() && j.contains("host_matmul_flops_per_s")) {
    s = number("host_matmul_flops_per_s", &f.host_matmul_flops_per_s);
  }
  if (s.ok() && j.contains("blocked_attention_flops_per_s")) {
    s = number("blocked_attention_flops_per_s", &f.blocked_attention_flops_per_s);
  }
  if (s.ok() && j.contains("blocked_attention_d128_flops_per_s")) {
    s = number("blocked_attention_d128_flops_per_s", &f.blocked_attention_d128_flops_per_s);
  }
  if (s.ok() && j.contains("nvme_adam_params_per_s")) {
    s = number("nvme_adam_params_per_s", &f.nvme_adam_params_per_s);
  }
  if (s.ok()) s = number("allreduce_bytes_per_s", &f.allreduce_bytes_per_s);
  double baseline = 0;
  if (s.ok()) s = number("process_baseline_bytes", &baseline);
  if (!s.ok()) return s;
  f.process_baseline_bytes = static_cast<int64_t>(baseline);
  return f;
}

absl::StatusOr<HardwareFigures> LoadHardwareFigures(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("figures file: ", text.status().message(),
                                                           " (write one with `strata bench figures`)"));
  }
  return ParseHardwareFigures(*text, path);
}

}  // namespace strata::policies
