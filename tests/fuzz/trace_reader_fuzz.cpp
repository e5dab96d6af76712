// libFuzzer target: the structured-trace reader behind `protean report`, then the analysis and the
// plain-text report over whatever it read (a damaged trace must still give a report or an Error).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "observe/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  protean::fuzz::expect_only_protean_errors("trace_reader", [&] {
    using namespace protean::observe::report;
    std::string text(reinterpret_cast<const char*>(data), size);
    // The first line goes to one rank's file, the rest to another's: cross-file joins get exercised.
    size_t nl = text.find('\n');
    std::vector<std::pair<std::string, std::string>> files = {
        {"protean_trace_rank0_pid1_0.jsonl", text.substr(0, nl == std::string::npos ? text.size() : nl + 1)},
        {"protean_trace_rank1_pid2_0.jsonl", nl == std::string::npos ? std::string() : text.substr(nl + 1)}};
    TraceModel model = read_trace_texts(files);
    Analysis a = analyse(model);
    (void)render_plain_text(model, a);
  });
  return 0;
}
