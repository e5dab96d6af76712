#include "loop/schedule_policy.h"

#include <fmt/format.h>

#include "protean/error.h"
#include "sym/printer.h"

namespace protean::loop {

const char* strategy_name(ReductionStrategy s) {
  switch (s) {
    case ReductionStrategy::None: return "none";
    case ReductionStrategy::Serial: return "serial";
    case ReductionStrategy::VectorMinMax: return "vector_minmax";
    case ReductionStrategy::Lanes: return "lanes";
    case ReductionStrategy::Welford: return "welford";
    case ReductionStrategy::Warp: return "warp";
    case ReductionStrategy::Block: return "block";
  }
  return "?";
}

const char* gpu_form_name(GpuForm f) {
  switch (f) {
    case GpuForm::None: return "none";
    case GpuForm::GridStride: return "grid_stride";
    case GpuForm::WarpPerRow: return "warp_per_row";
    case GpuForm::BlockPerRow: return "block_per_row";
    case GpuForm::SingleBlock: return "single_block";
  }
  return "?";
}

sym::Expr kernel_work(const Kernel& k) {
  sym::Expr outer_n = sym::integer(1);
  for (const auto& s : k.outer) outer_n = sym::mul(outer_n, s);
  sym::Expr inner_n = sym::integer(1);
  for (const Stage& s : k.stages) {
    sym::Expr n = sym::integer(1);
    for (const auto& e : s.inner) n = sym::mul(n, e);
    inner_n = sym::maximum(inner_n, n);
  }
  return simplify_index(sym::mul(outer_n, inner_n));
}

void apply_schedule(Program& p, const SchedulePolicy& policy) {
  std::vector<Schedule> all = policy.schedule(p);
  if (all.size() != p.kernels.size())
    throw CompileError(fmt::format("schedule policy '{}' returned {} schedules for the {} kernels of program '{}'",
                                   policy.target(), all.size(), p.kernels.size(), p.name));
  for (size_t i = 0; i < all.size(); ++i) {
    Kernel& k = p.kernels[i];
    if (all[i].stages.size() != k.stages.size())
      throw CompileError(fmt::format("schedule policy '{}' returned {} stage schedules for the {} stages of {} in program '{}'",
                                     policy.target(), all[i].stages.size(), k.stages.size(), k.name, p.name));
    all[i].target = std::string(policy.target());
    k.schedule = std::move(all[i]);
  }
}

std::string schedule_text(const Kernel& k) {
  const Schedule& s = k.schedule;
  if (s.target.empty()) return "schedule none";
  std::string out = fmt::format("schedule {}:", s.target);
  std::string sep = " ";
  auto item = [&](const std::string& t) {
    out += sep + t;
    sep = ", ";
  };
  if (s.fused_pointwise) item("fused pointwise");
  if (s.parallel_axes > 0) {
    std::string axes;
    for (size_t i = 0; i < s.parallel_axes; ++i) axes += (i ? " " : "") + outer_var(i)->name;
    item(fmt::format("parallel {}{}", axes, s.collapse ? fmt::format(" collapse({})", s.collapse) : ""));
  }
  if (s.parallel_inner) item("parallel inner");
  if (s.work) item(fmt::format("work {}", sym::print(s.work)));
  if (s.work_threshold > 0) item(fmt::format("threshold {}", s.work_threshold));
  if (s.vector_width > 0) item(fmt::format("vector_width {} ({} B)", s.vector_width, s.vector_bytes));
  if (s.vector) item("vector");
  if (s.threads_per_row != 1) item(fmt::format("threads_per_row {}", s.threads_per_row));
  if (s.rows_per_block != 1) item(fmt::format("rows_per_block {}", s.rows_per_block));
  if (s.rows_persist) item("rows persist");
  if (s.gpu_form != GpuForm::None) {
    item(fmt::format("grid {}", gpu_form_name(s.gpu_form)));
    item(fmt::format("block_threads {}", s.block_threads));
    if (s.min_blocks > 0) item(fmt::format("min_blocks {}", s.min_blocks));
    if (s.persist_chunks > 0) item(fmt::format("persist {}", s.persist_chunks));
    item(s.index32 ? "index32" : "index64");
  }
  return out;
}

std::string stage_schedule_text(const Kernel& k, size_t stage) {
  if (stage >= k.schedule.stages.size()) return "";
  const StageSchedule& st = k.schedule.stages[stage];
  std::string out;
  std::string sep = "";
  auto item = [&](const std::string& t) {
    out += sep + t;
    sep = ", ";
  };
  if (st.reduction != ReductionStrategy::None)
    item(st.lanes ? fmt::format("{} {}", strategy_name(st.reduction), st.lanes) : strategy_name(st.reduction));
  if (st.vector && !k.schedule.fused_pointwise) item("vector");
  if (st.block) item(fmt::format("blocks of {}", st.block));
  for (const PrefetchLoad& l : st.prefetch) item(fmt::format("prefetch b{}[{}]", l.buffer, sym::print(l.index)));
  return out;
}

}  // namespace protean::loop
