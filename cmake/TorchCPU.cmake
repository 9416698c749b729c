# Imports the CPU libtorch a torch wheel ships as the target TorchLLGA::libtorch.
# The wheel's own TorchConfig.cmake insists on CUDA's development files for a CUDA build of torch,
# which a CPU library does not use; this needs only the wheel.
# Where the wheel is: TORCH_ROOT, else a Torch/TorchConfig.cmake on CMAKE_PREFIX_PATH
# (torch.utils.cmake_prefix_path), else the torch of the Python on PATH.
if(TARGET TorchLLGA::libtorch)
  return()
endif()
if(NOT TORCH_ROOT)
  find_path(TORCH_LLGA_TORCH_CMAKE_DIR Torch/TorchConfig.cmake)
  if(TORCH_LLGA_TORCH_CMAKE_DIR)
    get_filename_component(TORCH_ROOT "${TORCH_LLGA_TORCH_CMAKE_DIR}/../.." ABSOLUTE)
  else()
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
                    OUTPUT_VARIABLE TORCH_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  endif()
endif()
if(NOT EXISTS "${TORCH_ROOT}/lib/libtorch_cpu.so")
  message(FATAL_ERROR "TorchLLGA: no libtorch at TORCH_ROOT=${TORCH_ROOT}; pass -DCMAKE_PREFIX_PATH=\$(python -c "
                      "'import torch.utils; print(torch.utils.cmake_prefix_path)') or -DTORCH_ROOT=<site-packages>/torch")
endif()
add_library(TorchLLGA::libtorch INTERFACE IMPORTED)
set_target_properties(TorchLLGA::libtorch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${TORCH_ROOT}/include;${TORCH_ROOT}/include/torch/csrc/api/include"
  INTERFACE_LINK_LIBRARIES "${TORCH_ROOT}/lib/libtorch.so;${TORCH_ROOT}/lib/libtorch_cpu.so;${TORCH_ROOT}/lib/libc10.so"
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1"
  INTERFACE_LINK_OPTIONS "-Wl,-rpath,${TORCH_ROOT}/lib")
