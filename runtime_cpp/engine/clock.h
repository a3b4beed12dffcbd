// Time on a monotonic clock, in milliseconds from an arbitrary origin.
#pragma once

namespace ninfer {

double now_ms();

}  // namespace ninfer
