// protean::onnx — runs ONNX models through the public op API (eagerly, or captured by protean::compile).
//
// A loaded Model is a protean::Module whose forward() evaluates the ONNX graph node by node with the
// ops of protean/ops.h — no private back doors — so the same code runs eagerly on real tensors and
// under capture on FakeTensors with symbolic sizes.
//
// Semantics worth knowing (details and tolerances in docs/onnx.md):
//  * Weights (initializers and `Constant` nodes) stay real tensors owned by the model and are baked
//    into captured graphs as constants (they are not registered as parameters/buffers).
//  * Constant folding at load: a node whose inputs are all constants is evaluated once (eagerly).
//  * Shape arithmetic (Shape, Size, Gather, Slice, Cast, Concat, Squeeze, Unsqueeze, Equal, Not,
//    Add/Sub/Mul/Div on shape values, Reshape's 0 and -1) runs on host SymInts, so a dynamic dim
//    stays symbolic through Reshape. Small integer constants (<= 8 elements) join that arithmetic.
//  * `If` on a shape-derived condition evaluates the SymBool (a guard under capture) and runs only the
//    taken branch; on a data condition it reads the value (`item<bool>()`): a graph break under capture.
//  * Rank-0 integer inputs (Silero VAD's `sr`) may be passed as host scalars (forward's
//    `scalar_inputs`, or LoadOptions::scalar_inputs_as_host): an If on them then specializes.
//  * Errors: protean::FormatError (unreadable/corrupt file, names the file), NotImplementedError (every
//    unsupported op type with node names and opset, in one message), ValueError (wrong input name,
//    count, rank, dtype, static dim or a violated spatial-alignment rule; names the input and the
//    declared shape). Errors raised by an op while running a node are rethrown with the same type and
//    the prefix "while running node 'NAME' (OpType): ".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protean/module.h"
#include "protean/tensor.h"

namespace protean::onnx {

/// Declared type of a graph input or output.
struct TensorInfo {
  std::string name;
  /// Element type; nullopt when ONNX declares a type Protean has no dtype for (e.g. int16, string).
  std::optional<DType> dtype;
  /// ONNX TensorProto.DataType number (1 = float, 7 = int64, ...); 0 when undeclared.
  int32_t onnx_elem_type = 0;
  /// False when the model declares no shape at all (any rank accepted).
  bool has_shape = false;
  /// Per dim: the static size, or nullopt for a dynamic dim (named by dim_params[i] when non-empty).
  std::vector<std::optional<int64_t>> dims;
  std::vector<std::string> dim_params;
  /// Declared `optional(tensor(...))` (ONNX IR 8, opset 15+); dtype and dims describe the tensor it
  /// holds. Model::forward takes an undefined Tensor for the empty optional in such an input, and an
  /// optional output comes back as an undefined Tensor when the model leaves it empty (as ONNX
  /// Runtime returns None). Optionals of sequences have no public type (sequences have none).
  bool optional = false;
  /// "f32[N, 3, 48, W]" (unnamed dynamic dims print as `?`); "optional(f32[N])" for an optional.
  std::string str() const;
};

struct LoadOptions {
  /// Evaluate nodes whose inputs are all constants once at load.
  bool fold_constants = true;
  /// Treat every rank-0 integer input (given as a real tensor) as a host scalar: its value is read
  /// on the host and joins the shape arithmetic, so an `If` on it specializes to one branch. Under
  /// capture, pass such inputs through forward's `scalar_inputs` instead (a guarded int).
  bool scalar_inputs_as_host = false;
  /// Check input spatial dims against the alignment rule derived at load (see spatial_multiple()).
  bool check_spatial_alignment = true;
  /// The element type the model's 32-bit floats become: F32 (as the file says) or BF16 / F16, which
  /// runs the model as a half-precision one, like PyTorch's `model.to(torch.bfloat16)` on the module
  /// the file was exported from. At load, every float32 initializer and Constant (and the float value
  /// of ConstantOfShape) is rounded to this type, `Cast(to=FLOAT)` casts to it, and float32 graph
  /// inputs and outputs are declared with it; forward() casts float32 input tensors to it (inputs
  /// already of this type are taken as they are). Ops compute as they do for that dtype (bf16/f16
  /// storage, f32 accumulation in reductions and matrix products). Other dtypes (f64, f16 data in
  /// the file, integers) are left alone. Any other value is a ValueError at load.
  DType float_dtype = DType::F32;
  /// Where the weights live. With a CUDA device, every initializer and folded constant of at least
  /// kDeviceConstantElements elements is copied there once at load (after constant folding), so a
  /// compiled function (backend cuda) uploads nothing when it is built, however many graphs it
  /// compiles; smaller constants stay on the host (they join shape arithmetic and the compilers read
  /// scalars at compile time). Inputs are then expected on that device. Eager forward() still runs:
  /// ops on device tensors run on host copies (slow; perf_hints says so). RuntimeError at load when
  /// no CUDA driver is present.
  Device device = kCPU;
  /// Find the model's repeated blocks at load (same ops, attributes and weight shapes, different
  /// weights: transformer layers, the equal units of a convolutional stage) and compile each as a
  /// region: traced and compiled once, called once per use with that use's weights as inputs
  /// (docs/regions.md, "ONNX models"; CompileOptions::auto_regions turns it off per compile).
  /// Eager forward() and compiles without auto regions run the same nodes inline.
  bool find_regions = true;
  /// The fewest nodes a block must have to become a region. Each region variant is a C++ translation
  /// unit of its own (one more compiler run) and its boundary ends channels-last chains and weight
  /// folding, while the kernel dedup of a flat compile already builds equal kernels once: on PP-OCRv4
  /// rec, regions of its 9- and 18-node convolution units made the cold compile 15% and the steady
  /// call 24% slower (bench/results/onnx_regions_2026-12-02_min8.json), so blocks below 24 nodes stay flat.
  int64_t region_min_nodes = 24;
};

/// A repeated block found at load (LoadOptions::find_regions).
struct RegionInfo {
  /// The region type: "onnx.block<k>.<structural hash, 8 hex digits>" (equal blocks of two models
  /// have equal hashes and share a compiled body).
  std::string type;
  int64_t uses = 0;     ///< instances in the graph
  int64_t nodes = 0;    ///< ONNX nodes per instance
  int64_t weights = 0;  ///< per-instance weight tensors (inputs of each use)
  /// Per use: "nodes 'first'..'last'" (node names of the file).
  std::vector<std::string> sites;
};

/// LoadOptions::device moves constants with at least this many elements.
inline constexpr int64_t kDeviceConstantElements = 1024;

class Model : public Module {
 public:
  struct Impl;
  explicit Model(std::shared_ptr<Impl> impl);
  ~Model() override;

  /// Path the model was loaded from (or the name given to load_from_bytes).
  const std::string& path() const;
  /// Frame identity for caching/PGO: "onnx:<graph name>:<xxhash64 of the file bytes, 16 hex digits>",
  /// with "@bf16" / "@f16" appended when loaded with that LoadOptions::float_dtype.
  const std::string& identity() const;
  uint64_t content_hash() const;
  const std::string& graph_name() const;
  /// Version of the default (ai.onnx) opset the model file imports (1-21). Models below opset 7 are
  /// upgraded at load to opset 13 by ONNX's own version converter; this still returns the file's.
  int64_t opset() const;
  int64_t ir_version() const;
  const std::string& producer() const;

  /// Graph inputs that are not initializers, in ONNX order (these are forward's arguments).
  const std::vector<std::string>& input_names() const;
  const std::vector<std::string>& output_names() const;
  const std::vector<TensorInfo>& inputs() const;
  const std::vector<TensorInfo>& outputs() const;
  /// Nodes in the graph, recursively including If branches; and those left after constant folding.
  int64_t num_nodes() const;
  int64_t num_live_nodes() const;
  /// Spatial alignment derived at load: when a feature map downsampled by S is upsampled and merged
  /// with a finer one (an FPN, e.g. PP-OCR det: S = 32), every rank-4 input's H and W must be a
  /// multiple of S, otherwise the merge fails on mismatched sizes. 0 when the model has no such merge.
  int64_t spatial_multiple() const;
  /// The repeated blocks found at load, one entry per region type (empty when none were found or
  /// LoadOptions::find_regions is off).
  const std::vector<RegionInfo>& regions() const;

  /// Runs the model. `inputs`: one tensor per input_names() entry, in order, except inputs passed in
  /// `scalar_inputs` (rank-0 integer inputs given as host SymInts; their slot is skipped). Returns one
  /// tensor per output_names() entry. Throws ValueError on a wrong count/rank/dtype/static size, or
  /// an undefined tensor for an input that is not declared optional (TensorInfo::optional).
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs,
                              const std::map<std::string, SymInt>& scalar_inputs = {}) const;
  /// Runs the model with inputs by name; returns outputs by name. Unknown names are a ValueError.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;

 private:
  std::shared_ptr<Impl> impl_;
};

/// Loads an ONNX model file. Weights stored as external data (TensorProto.data_location = EXTERNAL,
/// e.g. `model.onnx.data`) are memory-mapped from files in the model's directory; a location outside
/// it (absolute, `..`, a symbolic link out) or an offset/length outside the file is a FormatError.
/// Throws RuntimeError when unreadable, FormatError when malformed (naming the file),
/// NotImplementedError listing every unsupported op type.
std::shared_ptr<Model> load(const std::string& path, const LoadOptions& options = {});
/// Same, from serialized ModelProto bytes; `name` stands for the file in messages. External data is
/// refused here (NotImplementedError): there is no directory to read it from.
std::shared_ptr<Model> load_from_bytes(const std::string& bytes, const std::string& name,
                                       const LoadOptions& options = {});

}  // namespace protean::onnx
