// A lower layer including a higher one: cmake/check_layers.cmake must reject this tree (ctest
// LayeringCheckCatchesAnUpwardInclude). Never compiled.
#include "capture/tracer.h"
#include "core/tensor.h"
