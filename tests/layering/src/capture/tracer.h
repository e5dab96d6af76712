// Fixture of LayeringCheckCatchesAnUpwardInclude (never compiled): a higher layer may include a lower one.
#pragma once
#include "core/tensor.h"
