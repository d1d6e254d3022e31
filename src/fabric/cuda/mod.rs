//! CUDA fabric (in progress).
