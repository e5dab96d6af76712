// Generates synthetic multi-rank compile traces for the report's scale test and benchmark.
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace protean::bench {

namespace fs = std::filesystem;

/// Writes one rank's trace: `frames` frames × `compiles` compiles × 20 events. Returns the event count.
inline int64_t write_rank(const fs::path& path, int rank, int frames, int compiles) {
  std::ofstream out(path, std::ios::binary);
  int64_t n = 0, ts = 0;
  auto ev = [&](const std::string& body) {
    out << fmt::format(R"J({{"v":1,"ts_us":{},"pid":{},"rank":{},{}}})J", ts += 50, 1000 + rank, rank, body) << '\n';
    ++n;
  };
  for (int f = 0; f < frames; ++f) {
    std::string fn = fmt::format("layer_{}", f);
    std::string loc = fmt::format(R"J({{"file":"model.cpp","line":{},"function":"{}"}})J", 100 + f, fn);
    for (int c = 0; c < compiles; ++c) {
      std::string id = fmt::format("{}/{}", f, c);
      int size = 64 * (c + 1);
      std::string reasons =
          c == 0 ? "[]" : fmt::format(R"J(["{}/{}: tensor 'x' size mismatch at index 1. expected {}, actual {}"])J", f, c - 1, size - 64, size);
      ev(fmt::format(R"J("event":"compile_start","frame":{},"compile_id":"{}","function":"{}","location":{},"reasons":{},"backend":"cpu","dynamic":"off")J",
                     f, id, fn, loc, reasons));
      for (int d = 0; d < 3; ++d)
        ev(fmt::format(R"J("event":"dimension_decision","compile_id":"{}","source":"x","dim":{},"decision":"static","why":"default","value":{})J",
                       id, d, d == 1 ? size : 8));
      ev(fmt::format(R"J("event":"create_symbol","compile_id":"{}","symbol":"s0","hint":{},"source":"n","range":"[2, int_oo]","location":{})J",
                     id, c + 2, loc));
      for (int g = 0; g < 3; ++g)
        ev(fmt::format(R"J("event":"guard_added","compile_id":"{}","expr":"Eq(x.size()[{}], {})","location":{})J", id, g, size, loc));
      std::string ir = fmt::format("graph {}(%x : f32[8, {}, 8], %w : f32[8]):\\n", fn, size);
      for (int k = 0; k < 12; ++k)
        ir += fmt::format("  %{} : f32[8, {}, 8] = {}(%x, %w)  # model.cpp:{}\\n", k, size, k % 2 ? "mul" : "add", 100 + k);
      ir += "  return (%11)";
      ev(fmt::format(R"J("event":"graph","compile_id":"{}","ir":"{}","node_count":15,"graph_hash":"h{}","inputs":[{{"source":"x","dtype":"f32","sizes":["8","{}","8"]}},{{"source":"w","dtype":"f32","sizes":["8"]}}])J",
                     id, ir, f, size));
      ev(fmt::format(R"J("event":"guards","compile_id":"{}","text":"tensor x: f32[8, {}, 8]\\ntensor w: f32[8]","count":2)J", id, size));
      ev(fmt::format(R"J("event":"specialization","compile_id":"{}","symbol":"s1","sources":["x.size()[0]"],"value":8,"reason":"Eq(s1, 8)","location":{})J",
                     id, loc));
      ev(fmt::format(R"J("event":"artifact","compile_id":"{}","kind":"cpp_source","name":"k_{}_{}.cpp","text":"{}")J", id, f, c,
                     std::string(400, 'k')));
      ev(fmt::format(R"J("event":"cache","tier":"disk","key":"k{}_{}_{}","result":"miss","compile_id":"{}")J", rank, f, c, id));
      for (const char* ph : {"capture", "guards", "passes", "lowering", "codegen", "cxx_compile"})
        ev(fmt::format(R"J("event":"chromium_event","name":"{}","ph":"X","ts":{},"dur":120,"args":{{"compile_id":"{}"}})J", ph, ts, id));
      ev(fmt::format(R"J("event":"compilation_metrics","compile_id":"{}","frame":{},"function":"{}","status":"success","phases":{{"capture":0.01,"guards":0.002,"passes":0.003,"lowering":0.004,"codegen":0.002,"cxx_compile":0.3}},"cache":{{"memory":"miss"}},"guard_count":2,"node_count":15,"graph_count":1)J",
                     id, f, fn));
    }
  }
  return n;
}

}  // namespace protean::bench
