// protean::Module — a container of parameters, buffers, sub-modules and integer attributes, like
// torch.nn.Module. Compiling a module's forward (protean::compile(std::shared_ptr<M>)) makes its
// parameters/buffers graph inputs with sources such as `self.blocks.3.attn.w` (static shapes by
// default, like PyTorch's force_parameter_static_shapes) and guards its registered attributes as
// constants (`self.n`) until one changes between calls: then it is a SymInt (automatic dynamic, like
// an int argument; CompileOptions::dynamic_attributes, Module::mark_static).
//
// References returned by register_parameter/register_buffer stay valid for the module's lifetime
// (members live in a std::deque, which never moves elements on push_back). Assigning a new tensor
// through such a reference is allowed: compiled forwards read the current tensor on every call.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "protean/tensor.h"

namespace protean {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Registers a trainable tensor under `name` (no dots). Returns a reference valid while the module
  /// lives. Throws ValueError on a duplicate, empty or dotted name.
  /// Unlike libtorch's register_parameter, requires_grad is left as the tensor has it (usually unset):
  /// a compiled function does not differentiate through its outputs (compile_train_step and
  /// value_and_grad put the backward inside the frame), so parameters that require grad would make
  /// every compiled inference call outside NoGradGuard warn. The optimizers train every parameter
  /// when none has requires_grad set; for an eager backward(), call requires_grad_() on them.
  Tensor& register_parameter(const std::string& name, Tensor t);
  /// Registers a non-trainable tensor (running stats, masks, caches).
  Tensor& register_buffer(const std::string& name, Tensor t);
  /// Registers a child module; its members get the prefix `name.`.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  /// Registers an integer attribute read by forward through attribute(name). When compiled it is a
  /// guarded constant at first; once its value changed between compiles it is a SymInt symbol
  /// (`self.name`), so further values reuse the graph (CompileOptions::dynamic_attributes).
  void register_attribute(const std::string& name, int64_t value);
  /// Reads an attribute; while a compiled forward is traced this is the traced value: a guarded
  /// constant, or a symbolic SymInt when the attribute is dynamic (the read is recorded so the guard
  /// exists). Throws ValueError for an unknown name.
  SymInt attribute(const std::string& name) const;
  /// Keeps attribute `name` a guarded constant in compiled forwards: every new value recompiles (for
  /// an attribute that selects code paths, like a layer count). Throws ValueError for an unknown name.
  void mark_static(const std::string& name);
  /// True after mark_static(name).
  bool attribute_is_static(const std::string& name) const;
  /// Changes an attribute (the next compiled call sees the new value through its guards).
  void set_attribute(const std::string& name, int64_t value);

  /// Parameters of this module and its children, with dotted names ("blocks.3.w"), in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  /// The tensors of named_parameters(), in the same order, each TensorImpl once (a weight registered
  /// under two names, tied, is listed at its first name): what an optimizer takes, as torch's
  /// nn.Module.parameters() (`optim::AdamW opt(model->parameters(), ...)`). The handles share the
  /// module's TensorImpls.
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, int64_t>> named_attributes() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;

  /// Moves every parameter and buffer of this module and its children to `device` in place, as
  /// torch's nn.Module.to(device) does: each member's TensorImpl is re-pointed to a copy of its
  /// storage on `device` (host→device, device→host or device→device, through the device's stream),
  /// so every handle of it — the module's members, an optimizer's parameter list, the user's copies —
  /// sees the moved tensor. Members that share a storage (a tied weight registered twice, views of
  /// one tensor) still share one afterwards; sizes, strides, dtype and requires_grad stay. Members
  /// already on `device` are untouched. An accumulated gradient is not moved (zero the gradients
  /// first); move the model before compile_train_step or an optimizer's first step, whose state is
  /// made on the parameters' device. Returns *this. Throws ValueError for a capture-time FakeTensor
  /// member (inside a compiled function), RuntimeError when `device` is CUDA and no driver or device
  /// is present, or the device is out of memory.
  Module& to(Device device);

  /// Stable addresses of every parameter and buffer (dotted names, parameters first per module),
  /// and of every attribute. Used by compile: the pointers stay valid while the module lives.
  struct Slots {
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    std::vector<std::pair<std::string, const int64_t*>> attributes;
  };
  Slots slots() const;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, Slots& out) const;
  std::deque<std::pair<std::string, Tensor>> params_;
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::deque<std::pair<std::string, int64_t>> attrs_;
  std::vector<std::string> static_attrs_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace protean
