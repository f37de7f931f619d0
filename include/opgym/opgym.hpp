// opgym: fused transformer operators with a C++ API that needs no framework.
#pragma once
#include "opgym/add_rms_norm.hpp"
#include "opgym/attn_softmax.hpp"
#include "opgym/cpu.hpp"
#include "opgym/dtype.hpp"
#include "opgym/error.hpp"
#include "opgym/parallel.hpp"
#include "opgym/rms_norm.hpp"
#include "opgym/rotary.hpp"
#include "opgym/swiglu.hpp"
#include "opgym/tensor.hpp"
#include "opgym/version.hpp"
