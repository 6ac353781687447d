// The pybind11 module `fastdpr.models._kernels_C`: the model kernels (attention.h, few_rows_linear.h,
// layer_norm.h, dropout.h), reached from fastdpr/models/ only, apart from the index core `fastdpr._C`. Both use the same
// CPU-feature registry (cpu.h) and argument checks (bind.h).
#include "bind.h"

PYBIND11_MODULE(_kernels_C, m) {
    namespace bind = fastdpr::bind;
    m.doc() = "fastdpr compiled model kernels: attention, few-rows linear layers, layer norm, seeded dropout";
    bind::bind_cpu(m);
    bind::bind_attention(m);
    bind::bind_linear(m);
    bind::bind_layer_norm(m);
    bind::bind_dropout(m);
}
