// Fixture of LayeringCheckCatchesAnUpwardInclude (never compiled).
#pragma once
