// Capture-time hook for Module::attribute: while a compiled forward is traced, attribute reads go to
// the tracer, which records them (so they are guarded) and returns the traced value.
#pragma once

#include <cstdint>
#include <string>

#include "protean/module.h"

namespace protean::capture {

class AttributeReader {
 public:
  virtual ~AttributeReader() = default;
  virtual SymInt read_attribute(const Module* m, const std::string& name, int64_t value) = 0;
};
/// The reader of this thread (nullptr outside capture).
AttributeReader* current_attribute_reader();
class AttributeReaderScope {
 public:
  explicit AttributeReaderScope(AttributeReader* r);
  ~AttributeReaderScope();
  AttributeReaderScope(const AttributeReaderScope&) = delete;
  AttributeReaderScope& operator=(const AttributeReaderScope&) = delete;

 private:
  AttributeReader* prev_;
};

}  // namespace protean::capture
