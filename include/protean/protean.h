// Umbrella header: everything a Protean user needs.
//   #include <protean/protean.h>
//   namespace pt = protean;
#pragma once

#include "protean/dtype.h"
#include "protean/error.h"
#include "protean/ops.h"
#include "protean/symint.h"
#include "protean/tensor.h"
#include "protean/version.h"
#include "protean/compile.h"
#include "protean/module.h"
#include "protean/autograd.h"
#include "protean/optim.h"
#include "protean/submodules.h"
#include "protean/cache.h"
#include "protean/onnx.h"
#include "protean/distributed.h"
