#include "torch_llga.h"

#include "jit/codegen/onednn/runtime/runtime.h"

namespace torch_llga {

void enable() { llga::runtime::set_enabled(true); }
void disable() { llga::runtime::set_enabled(false); }
bool is_enabled() { return llga::runtime::enabled(); }

}  // namespace torch_llga
