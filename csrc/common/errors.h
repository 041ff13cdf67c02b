// Errors that name where they happened: every error of a rank starts with rankPrefix.
#pragma once

#include <string>

namespace qcomm {

// "[qcomm rank r/N] ": the prefix of every error this rank raises.
inline std::string rankPrefix(int rank, int world) {
  return "[qcomm rank " + std::to_string(rank) + "/" + std::to_string(world) + "] ";
}

}  // namespace qcomm
