// The sanitized CPU tests' runtime options, built into the binary so that every way of running it
// (CTest, by hand, gtest discovery) gets them.
extern "C" {
// protect_shadow_gap=0: the CUDA runtime maps memory where ASan would keep its shadow gap.
// handle_segv=0: the launcher's tests kill ranks with SIGSEGV on purpose and check that it is named.
const char* __asan_default_options() {
  return "protect_shadow_gap=0:detect_leaks=1:abort_on_error=1:handle_segv=0";
}
const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }
}
