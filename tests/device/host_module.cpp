// Host build of one kernel module (prelude + module source in CSA_SOURCE).
#include "cuda_host_shim.h"
#include CSA_SOURCE
