// The headers a host build of a module includes before its source: the
// build precompiles them once per build folder and flags (emulation.py), and
// host_module.cpp includes them itself, so a build without the .gch is the same.
#ifndef CSA_HOST_HEADERS_H
#define CSA_HOST_HEADERS_H

#include <xmmintrin.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "cuda_host_shim.h"

#endif
