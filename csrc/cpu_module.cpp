// The pybind11 module `fastdpr._cpu`: the CPU-feature registry alone (cpu.h), so that fastdpr.cpu_features()
// answers without loading the index core or the model kernels (or torch).
#include "bind.h"

PYBIND11_MODULE(_cpu, m) {
    m.doc() = "fastdpr CPU-feature registry";
    fastdpr::bind::bind_cpu(m);
}
