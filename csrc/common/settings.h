// The one reader of QCOMM_* environment variables. Every setting is declared once, in
// settings.cpp, with its default, what it allows, a one-line doc and its scope:
//   process: read at its first use and kept for the life of the process;
//   group:   read afresh where a group takes it (its creation, or its CUDA set-up), because the
//            ranks of a group must agree on it and a program may set it between groups.
// An invalid value always raises std::invalid_argument (a ValueError in Python) naming the
// variable, the value and what is allowed. No torch here: the CUDA launch code reads it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qcomm {
namespace settings {

enum class Scope { kProcess, kGroup };

// How a setting's text is read.
enum class Kind {
  kChoice,   // one of `choices` (case-insensitive), kept in its canonical spelling
  kInteger,  // a whole number in [minimum, maximum], a power of two where powerOfTwo
  kBool,     // 1/0, true/false, yes/no, on/off
  kBits,     // 4, 8, or none (0 and the empty string mean none too)
  kText,     // any text (a path), kept as given less surrounding white space
};

struct Declaration {
  const char* name;  // QCOMM_...
  Kind kind;
  Scope scope;
  const char* defaultText;           // the value when unset, as the user would write it
  const char* allowed;               // what an error message and the docs say is allowed
  const char* doc;                   // one line
  const char* field;                 // the QuantConfig field it sets, or "" (not a config knob)
  std::vector<std::string> choices;  // kChoice
  int64_t minimum = 0, maximum = 0;  // kInteger
  bool powerOfTwo = false;           // kInteger
};

// A setting's value: its canonical text, and the number it stands for (kInteger: the number;
// kBool: 0 or 1; kBits: 0, 4 or 8; kChoice: the index in choices; kText: 0).
struct Value {
  std::string text;
  int64_t number = 0;
  bool fromEnvironment = false;  // false: the default
};

// Every declared setting, in documentation order.
const std::vector<Declaration>& declarations();

// The declaration of `name`; throws std::invalid_argument for an undeclared name.
const Declaration& declaration(const std::string& name);

// `raw` parsed as setting `name` would be; throws std::invalid_argument, naming the variable, the
// value and what is allowed, when it is not allowed.
Value parse(const std::string& name, const std::string& raw);

// The setting's value now: from the environment when set (and non-empty), else the default.
// Process-scoped settings are read once and then kept (reload() forgets them); group-scoped ones
// are read at every call (the caller reads them once per group).
Value get(const std::string& name);

// Shorthands of get(): the number, the text, and the number as a flag.
int64_t number(const std::string& name);
std::string text(const std::string& name);
inline bool flag(const std::string& name) { return number(name) != 0; }

// Forgets the process-scoped values read so far, so the next get() reads the environment again
// (test drivers and benchmarks that change the environment inside one process).
void reload();

}  // namespace settings
}  // namespace qcomm
