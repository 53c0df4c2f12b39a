// This machine's name, as hostname(1) prints it: what keel names a host by (the [dist] line, the
// ranks that stopped answering, a hardware_fault's device, faults[].host, TensorBoard's file name).
#pragma once

#include <string>

namespace keel {

// gethostname's answer, or `fallback` where it has none.
std::string host_name(const std::string& fallback);

}  // namespace keel
