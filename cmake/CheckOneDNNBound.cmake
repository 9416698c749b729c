# Run after the library's link (CMakeLists.txt): every oneDNN C function it calls must be one of
# the stubs bound at load time (dnnl.hpp's inline code calls C functions only gen_stubs.py's EXTRA
# lists from dnnl.h), or a program linking it would fail at load with "undefined symbol".
# setup.py's BuildChecked makes the same check for the Python extension.
#   cmake -DNM=<nm> -DLIBRARY=<the built library> -P CheckOneDNNBound.cmake
if(NOT NM OR NOT EXISTS "${NM}")
  return()
endif()
execute_process(COMMAND "${NM}" -D -u --format=just-symbols "${LIBRARY}" OUTPUT_VARIABLE symbols RESULT_VARIABLE failed)
if(failed)
  return()
endif()
string(REGEX MATCHALL "(^|\n)dnnl_[A-Za-z0-9_]+" unbound "${symbols}")
list(TRANSFORM unbound STRIP)
if(unbound)
  list(SORT unbound)
  list(JOIN unbound ", " names)
  message(FATAL_ERROR "torch_llga calls oneDNN functions csrc/onednn/gen_stubs.py does not bind: ${names} (add them to its EXTRA)")
endif()
