// Symbolic shape engine benchmarks: simplifying a 50-node expression, running a 20-guard program
// over 10 inputs, and SymInt arithmetic outside capture against plain int64 arithmetic.
#include <benchmark/benchmark.h>

#include <array>
#include <vector>

#include "protean/symint.h"
#include "sym/guard_eval.h"
#include "sym/printer.h"
#include "sym/shape_env.h"
#include "sym/simplify.h"

namespace {

using namespace protean;
using namespace protean::sym;

void BM_Simplify50Nodes(benchmark::State& state) {
  RangeAnalyzer ra(ValueRange{2, kIntOo});
  Expr e = parse(
      "Max(1, ((4*s0 + 8)//4)*s1 + Mod(2*s2, 2) - (s1*s0 + s1)) + Min(s0, 1) + ((s0*s1)//s1) + "
      "CeilDiv(6*s2, 3) + Mod(s0, 2) + 2*(s0//2) + Max(s3, s3 + 1) + ((s4 + 4)//2)");
  state.counters["nodes"] = e->node_count;
  for (auto _ : state) {
    ra.clear_cache();  // measure the analysis too, not only cache hits
    benchmark::DoNotOptimize(simplify(e, &ra));
  }
}
BENCHMARK(BM_Simplify50Nodes);

// 10 inputs, 20 guards: ranges of 8 symbols, a duck-sized pair, a specialization, a replacement,
// divisibility and relational guards.
GuardProgram make_guard_program() {
  ShapeEnv env;
  std::vector<SymInt> s;
  std::vector<SourceSlot> slots;
  const int64_t hints[] = {8, 8, 33, 64, 128, 16, 4, 12, 24, 7};
  for (int i = 0; i < 10; ++i) {
    std::string src = "in" + std::to_string(i) + ".size()[0]";
    s.push_back(env.create_symbol(src, hints[i], DimKind::Duck));
    slots.push_back({src, i});
  }
  {
    ShapeEnvScope scope(env);
    (void)static_cast<bool>(s[2] == 33);
    (void)static_cast<bool>(s[8] == 2 * s[7]);
    (void)static_cast<bool>(s[3] % 8 == 0);
    (void)static_cast<bool>(s[4] % 16 == 0);
    (void)static_cast<bool>(s[3] < s[4]);
    (void)static_cast<bool>(s[5] * s[6] == 64);
    (void)static_cast<bool>(s[9] < 1024);
    (void)static_cast<bool>(s[6] <= s[5]);
    (void)static_cast<bool>(s[7] % 4 == 0);
    (void)static_cast<bool>(s[0] + s[5] < s[4]);
    (void)static_cast<bool>(s[9] != 5);
    (void)static_cast<bool>((s[3] + 1) / 2 > s[5]);
  }
  GuardProgram p = compile_guards(env, slots);
  return p;
}

void BM_GuardProgram20Guards10Inputs(benchmark::State& state) {
  GuardProgram p = make_guard_program();
  int64_t slots[] = {8, 8, 33, 64, 128, 16, 4, 12, 24, 7};
  state.counters["guards"] = static_cast<double>(p.num_guards());
  state.counters["insns"] = static_cast<double>(p.num_instructions());
  for (auto _ : state) {
    benchmark::DoNotOptimize(slots);
    benchmark::DoNotOptimize(p.evaluate(slots));
  }
}
BENCHMARK(BM_GuardProgram20Guards10Inputs);

// Both arithmetic benchmarks read their operands from memory the compiler cannot see through
// (DoNotOptimize on the array + ClobberMemory) and write the result back to memory, so neither side
// can constant-fold, and the SymInt side cannot prove its operands are plain.
void BM_PlainInt64Arithmetic(benchmark::State& state) {
  std::array<int64_t, 3> in{7, 3, 11};
  std::array<int64_t, 1> out{};
  for (auto _ : state) {
    benchmark::DoNotOptimize(in.data());
    benchmark::ClobberMemory();
    out[0] = (in[0] + in[1]) * in[2] - in[0];
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_PlainInt64Arithmetic);

void BM_SymIntArithmeticOutsideCapture(benchmark::State& state) {
  std::array<SymInt, 3> in{7, 3, 11};
  std::array<SymInt, 1> out{};
  for (auto _ : state) {
    benchmark::DoNotOptimize(in.data());
    benchmark::ClobberMemory();
    out[0] = (in[0] + in[1]) * in[2] - in[0];
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SymIntArithmeticOutsideCapture);

// A realistic size computation: numel and a contiguous stride vector of a 4-d shape.
void BM_PlainInt64Strides(benchmark::State& state) {
  std::vector<int64_t> sizes{8, 3, 224, 224}, strides(4);
  for (auto _ : state) {
    benchmark::DoNotOptimize(sizes.data());
    int64_t acc = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      strides[i] = acc;
      acc *= sizes[i];
    }
    benchmark::DoNotOptimize(acc);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_PlainInt64Strides);

void BM_SymIntStridesOutsideCapture(benchmark::State& state) {
  std::vector<SymInt> sizes{8, 3, 224, 224}, strides(4);
  for (auto _ : state) {
    benchmark::DoNotOptimize(sizes.data());
    SymInt acc = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      strides[i] = acc;
      acc = acc * sizes[i];
    }
    benchmark::DoNotOptimize(acc);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SymIntStridesOutsideCapture);

void BM_SymIntArithmeticInsideCapture(benchmark::State& state) {
  ShapeEnv env;
  SymInt a = env.create_symbol("x.size()[0]", 7, DimKind::Dynamic);
  SymInt b = env.create_symbol("x.size()[1]", 3, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  for (auto _ : state) {
    SymInt r = (a + b) * 11 - a;
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_SymIntArithmeticInsideCapture);

}  // namespace

BENCHMARK_MAIN();
