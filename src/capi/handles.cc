#include "capi/handles.h"

namespace asynctp::capi {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

Registry& comms() {
  static Registry* r = new Registry();
  return *r;
}

Registry& symmetrics() {
  static Registry* r = new Registry();
  return *r;
}

Registry& groups() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace asynctp::capi
