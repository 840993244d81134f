// A rank that crashes (SIGSEGV, SIGBUS, SIGILL, SIGFPE) prints its thread's stack to stderr before it
// dies as it would have: the launcher names the signal, this says where. Installed before main, so
// that every forked rank inherits it.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <initializer_list>

namespace {

void print_stack_and_die(int signal_number) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char header[] = "crashed; the crashing thread's stack:\n";
  (void)!write(2, header, sizeof header - 1);
  backtrace_symbols_fd(frames, n, 2);
  raise(signal_number);  // the handler was reset on entry (SA_RESETHAND): the default action now
}

[[maybe_unused]] const bool installed = [] {
  struct sigaction action = {};
  action.sa_handler = print_stack_and_die;
  action.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (const int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(s, &action, nullptr);
  return true;
}();

}  // namespace
