// The Python binding of ScriptDoor (script_door.cpp): the torch.compile and export doors' usual
// call in C++. Python binding only, as init.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace llga {

void bind_script_door(pybind11::module& m);

}  // namespace llga
