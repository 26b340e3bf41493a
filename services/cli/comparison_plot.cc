#include "services/cli/comparison_plot.h"

#if STRATA_WITH_PLOT
#include <cairo-svg.h>
#include <cairo.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::services {
#if STRATA_WITH_PLOT
namespace {

constexpr double kWidth = 1280, kHeight = 840;
constexpr double kPanelW = 520, kPanelH = 310;
// One colour per run (colour-blind-safe pairs first), then per bar series.
constexpr std::array<std::array<double, 3>, 6> kColours = {{{0.00, 0.45, 0.70},
                                                            {0.84, 0.37, 0.00},
                                                            {0.00, 0.62, 0.45},
                                                            {0.80, 0.47, 0.65},
                                                            {0.90, 0.62, 0.00},
                                                            {0.34, 0.71, 0.91}}};

struct Panel {
  double x, y;  // top-left of the plotting area
  double w = kPanelW, h = kPanelH;
};

void SetColour(cairo_t* cr, size_t i) {
  const auto& c = kColours[i % kColours.size()];
  cairo_set_source_rgb(cr, c[0], c[1], c[2]);
}

void Text(cairo_t* cr, double x, double y, const std::string& text, double size, bool centred = false,
          bool bold = false) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t extents;
  cairo_text_extents(cr, text.c_str(), &extents);
  cairo_move_to(cr, centred ? x - extents.width / 2 - extents.x_bearing : x, y);
  cairo_show_text(cr, text.c_str());
}

std::string Tick(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  if (a >= 1) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.2f", v);
}

// Frame, title, y ticks from 0 (or lo) to hi, and the y label.
void Axes(cairo_t* cr, const Panel& p, const std::string& title, const std::string& y_label, double lo, double hi) {
  cairo_set_source_rgb(cr, 0, 0, 0);
  Text(cr, p.x + p.w / 2, p.y - 14, title, 15, true, true);
  cairo_set_line_width(cr, 1);
  for (int i = 0; i <= 4; ++i) {
    const double y = p.y + p.h - p.h * i / 4;
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_move_to(cr, p.x, y);
    cairo_line_to(cr, p.x + p.w, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    const std::string tick = Tick(lo + (hi - lo) * i / 4);
    cairo_text_extents_t e;
    cairo_set_font_size(cr, 11);
    cairo_text_extents(cr, tick.c_str(), &e);
    Text(cr, p.x - 6 - e.width, y + 4, tick, 11);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, p.x, p.y, p.w, p.h);
  cairo_stroke(cr);
  cairo_save(cr);
  cairo_move_to(cr, p.x - 48, p.y + p.h / 2);
  cairo_rotate(cr, -M_PI / 2);
  cairo_text_extents_t e;
  cairo_set_font_size(cr, 12);
  cairo_text_extents(cr, y_label.c_str(), &e);
  cairo_rel_move_to(cr, -e.width / 2, 0);
  cairo_show_text(cr, y_label.c_str());
  cairo_restore(cr);
}

// Curves per run against the iteration.
void Curves(cairo_t* cr, const Panel& p, const std::string& title, const std::string& y_label,
            const std::vector<const std::vector<std::pair<double, double>>*>& series) {
  double x_max = 1, lo = 0, hi = 0;
  bool any = false;
  for (const auto* s : series) {
    for (const auto& [x, y] : *s) {
      x_max = std::max(x_max, x);
      lo = any ? std::min(lo, y) : y;
      hi = any ? std::max(hi, y) : y;
      any = true;
    }
  }
  lo = std::min(lo, 0.0);
  if (hi <= lo) hi = lo + 1;
  hi += (hi - lo) * 0.05;
  Axes(cr, p, title, y_label, lo, hi);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  // Iterations are whole numbers: at most five ticks, on whole iterations
  // (a 2-iteration run gets 0 and 1, not 0 0 0 1 1).
  const double step = std::max(1.0, std::ceil(x_max / 4));
  for (double it = 0; it <= x_max + 1e-9; it += step) {
    Text(cr, p.x + p.w * it / x_max, p.y + p.h + 16, absl::StrFormat("%.0f", it), 11, true);
  }
  Text(cr, p.x + p.w / 2, p.y + p.h + 34, "iteration", 12, true);
  if (!any) {
    Text(cr, p.x + p.w / 2, p.y + p.h / 2, "(no data)", 13, true);
    return;
  }
  cairo_set_line_width(cr, 2.2);
  for (size_t r = 0; r < series.size(); ++r) {
    SetColour(cr, r);
    bool first = true;
    for (const auto& [x, y] : *series[r]) {
      const double px = p.x + p.w * x / x_max, py = p.y + p.h - p.h * (y - lo) / (hi - lo);
      if (first) {
        cairo_move_to(cr, px, py);
      } else {
        cairo_line_to(cr, px, py);
      }
      first = false;
    }
    cairo_stroke(cr);
    if (series[r]->size() == 1) {  // a lone point still shows
      const auto& [x, y] = series[r]->front();
      cairo_arc(cr, p.x + p.w * x / x_max, p.y + p.h - p.h * (y - lo) / (hi - lo), 3, 0, 2 * M_PI);
      cairo_fill(cr);
    }
  }
}

// Groups of bars: one group per key, one bar per run.
void Bars(cairo_t* cr, const Panel& p, const std::string& title, const std::string& y_label,
          const std::vector<std::string>& keys, const std::vector<RunCurves>& runs,
          const std::map<std::string, double> RunCurves::*field) {
  double hi = 0;
  for (const auto& run : runs)
    for (const auto& k : keys) hi = std::max(hi, (run.*field).count(k) ? (run.*field).at(k) : 0.0);
  if (hi <= 0) hi = 1;
  hi *= 1.12;
  Axes(cr, p, title, y_label, 0, hi);
  const double group = p.w / static_cast<double>(keys.size());
  const double bar = group * 0.7 / static_cast<double>(std::max<size_t>(1, runs.size()));
  for (size_t k = 0; k < keys.size(); ++k) {
    const double left = p.x + group * static_cast<double>(k) + group * 0.15;
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    Text(cr, p.x + group * (static_cast<double>(k) + 0.5), p.y + p.h + 18, keys[k], 12, true);
    for (size_t r = 0; r < runs.size(); ++r) {
      const auto& values = runs[r].*field;
      const double v = values.count(keys[k]) ? values.at(keys[k]) : 0.0;
      const double h = p.h * v / hi;
      const double x = left + bar * static_cast<double>(r);
      SetColour(cr, r);
      cairo_rectangle(cr, x, p.y + p.h - h, bar - 2, h);
      cairo_fill(cr);
      cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
      Text(cr, x + (bar - 2) / 2, p.y + p.h - h - 4, Tick(v), 10, true);
    }
  }
}

}  // namespace

absl::Status WriteComparisonPlot(const std::vector<RunCurves>& runs, const std::string& path) {
  if (runs.empty()) return absl::InvalidArgumentError("--plot: no runs to draw");
  const bool svg = absl::EndsWithIgnoreCase(path, ".svg");
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      svg ? cairo_svg_surface_create(path.c_str(), kWidth, kHeight)
          : cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(kWidth), static_cast<int>(kHeight)),
      cairo_surface_destroy);
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("--plot: cannot create ", path, ": ",
                                               cairo_status_to_string(cairo_surface_status(surface.get()))));
  }
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> context(cairo_create(surface.get()), cairo_destroy);
  cairo_t* cr = context.get();
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);

  // Legend: one swatch per run.
  double x = 80;
  for (size_t r = 0; r < runs.size(); ++r) {
    SetColour(cr, r);
    cairo_rectangle(cr, x, 14, 18, 12);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    Text(cr, x + 24, 25, runs[r].name, 14, false, true);
    cairo_text_extents_t e;
    cairo_text_extents(cr, runs[r].name.c_str(), &e);
    x += 24 + e.x_advance + 30;
  }

  std::vector<const std::vector<std::pair<double, double>>*> eval, kl;
  for (const auto& run : runs) {
    eval.push_back(&run.eval_score);
    kl.push_back(&run.kl);
  }
  Curves(cr, {80, 70}, "Eval score", "score", eval);
  Curves(cr, {720, 70}, "KL to the reference", "KL", kl);
  Bars(cr, {80, 490}, "Time per iteration, by phase (mean)", "seconds", {"rollout", "score", "update"}, runs,
       &RunCurves::phase_seconds);
  Bars(cr, {720, 490}, "Peak memory, by tier", "MiB", {"device", "host", "nvme"}, runs, &RunCurves::peak_mib);

  if (svg) {
    cairo_surface_finish(surface.get());
  } else if (cairo_surface_write_to_png(surface.get(), path.c_str()) != CAIRO_STATUS_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("--plot: cannot write ", path));
  }
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("--plot: ", path, ": ", cairo_status_to_string(cairo_surface_status(surface.get()))));
  }
  return absl::OkStatus();
}

#else
// A build without cairo (-DSTRATA_WITH_PLOT=OFF, the GPU machine's).
absl::Status WriteComparisonPlot(const std::vector<RunCurves>&, const std::string& path) {
  return absl::UnimplementedError(
      absl::StrCat("--plot ", path, ": this build has no cairo (STRATA_WITH_PLOT=OFF); the table needs no --plot"));
}
#endif  // STRATA_WITH_PLOT

}  // namespace strata::services
