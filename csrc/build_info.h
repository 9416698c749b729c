#pragma once
#include <string>

namespace llga {
// Empty if the running torch names its operators as the torch this library was compiled against
// did; otherwise the sentence saying it does not. Another torch release numbers the interned
// symbols (aten::relu, ...) differently: the fuser would match the wrong ops. Python checks the
// recorded torch before loading the library (torch_llga/_build.py); this covers every other way
// in (a preloaded or linked libtorch_llga.so): the fuser stays off.
const std::string& torch_mismatch();
}  // namespace llga
