// The declarations of every QCOMM_* setting, and their reader (settings.h). The README's and
// docs/'s tables of settings are checked against these declarations by tests/test_settings.py.
#include "common/settings.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

namespace qcomm {
namespace settings {
namespace {

using K = Kind;
using S = Scope;

std::vector<Declaration> makeDeclarations() {
  std::vector<Declaration> d;
  auto choice = [&](const char* name, S scope, const char* def, std::vector<std::string> choices,
                    const char* allowed, const char* doc, const char* field = "") {
    Declaration x{name, K::kChoice, scope, def, allowed, doc, field};
    x.choices = std::move(choices);
    d.push_back(x);
  };
  auto integer = [&](const char* name, S scope, const char* def, int64_t lo, int64_t hi, bool pow2,
                     const char* allowed, const char* doc, const char* field = "") {
    Declaration x{name, K::kInteger, scope, def, allowed, doc, field};
    x.minimum = lo;
    x.maximum = hi;
    x.powerOfTwo = pow2;
    d.push_back(x);
  };
  auto boolean = [&](const char* name, S scope, const char* def, const char* doc,
                     const char* field = "") {
    d.push_back(
        Declaration{name, K::kBool, scope, def, "1/0, true/false, yes/no, on/off", doc, field});
  };
  auto text = [&](const char* name, S scope, const char* def, const char* allowed,
                  const char* doc) {
    d.push_back(Declaration{name, K::kText, scope, def, allowed, doc, ""});
  };
  auto bits = [&](const char* name, const char* doc, const char* field) {
    d.push_back(Declaration{name, K::kBits, S::kGroup, "8", "4, 8 or none", doc, field});
  };

  // The quantization config: read when a group is created without an explicit config.
  choice("QCOMM_ALGO", S::kGroup, "auto", {"auto", "two_step", "ring", "semi_ring", "none"},
         "auto, two_step, ring, semi_ring, none",
         "the schedule of allreduces and quantized reduce-scatters; none passes every collective "
         "through",
         "algorithm");
  bits("QCOMM_RS_BITS", "bits of the reduce phase; none ships the input dtype", "rs_bits");
  bits("QCOMM_AG_BITS", "bits of the gather phase; none ships the input dtype", "ag_bits");
  integer("QCOMM_GROUP_SIZE", S::kGroup, "128", 32, 1024, true, "a power of two from 32 to 1024",
          "elements per quantization group (one scale each)", "group_size");
  boolean("QCOMM_SYMMETRIC", S::kGroup, "0",
          "absmax scale per group (1) or min/max scale and midpoint (0)", "symmetric");
  integer("QCOMM_MIN_BYTES", S::kGroup, "1048576", 0, INT64_MAX, false, "an integer >= 0",
          "smaller messages pass through exactly", "min_bytes");
  integer("QCOMM_MICROSHARDS", S::kGroup, "4", 1, 64, false, "an integer from 1 to 64",
          "pieces per chunk on CPU, so transfers overlap the codec; never changes the result",
          "microshards");
  choice("QCOMM_ROTATE", S::kGroup, "auto",
         {"auto", "1", "0", "true", "false", "yes", "no", "on", "off"},
         "auto, or 1/0, true/false, yes/no, on/off",
         "Hadamard-rotate each group before quantizing; auto: where a phase has 4 bits (for a "
         "reduce-scatter or all-gather, its own phase)",
         "rotate");
  boolean("QCOMM_STOCHASTIC_ROUNDING", S::kGroup, "0",
          "round codes stochastically: errors of mean zero over calls", "stochastic_rounding");
  boolean("QCOMM_TUNE", S::kGroup, "1",
          "auto times exact against quantized at each size class's first host-memory call, per "
          "collective (allreduces, and the reduce-scatters and all-gathers a group quantizes), "
          "checks a cached choice at its first use, re-tunes a class whose calls drift",
          "tune");
  integer("QCOMM_SHADOW", S::kGroup, "0", 0, INT32_MAX, false, "an integer >= 0",
          "every N-th quantized host-memory call (allreduce, reduce-scatter or all-gather) also "
          "runs the exact one on a copy and records the error (0: off)",
          "shadow");
  boolean("QCOMM_REDUCE_SCATTER", S::kGroup, "0",
          "quantize reduce_scatter_tensor and reduce_scatter with the reduce phase's codec",
          "reduce_scatter");
  boolean("QCOMM_ALL_GATHER", S::kGroup, "0",
          "quantize all_gather_into_tensor and all_gather with the gather phase's codec",
          "all_gather");
  text("QCOMM_TUNE_FILE", S::kGroup, "",
       "a regular file's path (a device node, FIFO or symlink is neither read nor written); "
       "empty: ~/.cache/qcomm/tune-<key>.json",
       "the tuning cache: measured choices are loaded from it (its key holds the network path) "
       "and saved to it");

  // The operator's switch: read when a group is created; its ranks must agree.
  boolean("QCOMM_DISABLE", S::kGroup, "0",
          "1 passes every collective through, whatever config the code passes; ranks must agree");
  // The CPU engine: read when a group is created.
  integer("QCOMM_CPU_THREADS", S::kGroup, "0", 0, 1024, false, "an integer from 0 to 1024",
          "threads of the codec in one quantized CPU call; 0: torch's intra-op threads, "
          "split among the group's ranks on this host");

  // The process: read at first use.
  choice("QCOMM_CPU_ISA", S::kProcess, "auto", {"auto", "generic", "avx2", "avx512"},
         "auto, generic, avx2, avx512 (one this CPU has)",
         "instruction set of the CPU codec loops; auto takes the widest this CPU has");
  boolean("QCOMM_CUDA_QUANTIZE", S::kProcess, "0",
          "quantize eligible CUDA allreduces, and the reduce-scatters and all-gathers of groups "
          "that quantize them (opt-in until timed against NCCL across GPUs)");
  choice("QCOMM_DEBUG", S::kProcess, "WARN", {"WARN", "INFO", "CHECK"}, "WARN, INFO, CHECK",
         "INFO: rank 0 prints each setting that differs from its default, and per group what "
         "its allreduces, reduce-scatters and all-gathers of each size class do; CHECK: INFO, "
         "and every eager CUDA-IPC call exchanges its header on the host first (a mismatch names "
         "its field; on every rank of a group created while any of its ranks sets it)");

  // A group's CUDA path: read when it sets up, at its first quantized CUDA allreduce.
  choice("QCOMM_TRANSPORT", S::kGroup, "auto", {"auto", "ipc", "nccl"}, "auto, ipc, nccl",
         "CUDA transport: IPC where every rank can map every peer's buffer, else NCCL");
  integer("QCOMM_IPC_BUFFER_MB", S::kGroup, "32", 1, 65536, false, "an integer from 1 to 65536",
          "each rank's CUDA-IPC buffer, in MiB (the same on every rank)");
#ifdef QCOMM_EXPERIMENTS
  choice("QCOMM_IPC_KERNELS", S::kGroup, "separate", {"separate", "fused"}, "separate, fused",
         "how CUDA IPC runs: codec kernels and copies (every algorithm), or the fused kernel "
         "(experiment, two_step only)");
#else
  choice("QCOMM_IPC_KERNELS", S::kGroup, "separate", {"separate"},
         "separate (fused needs a build with QCOMM_EXPERIMENTS=1)",
         "how CUDA IPC runs the algorithms: the codec kernels and copy kernels");
#endif
  integer("QCOMM_IPC_BLOCKS", S::kGroup, "0", 0, 1 << 20, false, "an integer >= 0",
          "caps the SMs the IPC kernels size their grids by (copies: twice that); 0: every SM");
  integer("QCOMM_IPC_SPIN_TIMEOUT_MS", S::kGroup, "0", 0, INT64_MAX, false, "an integer >= 0",
          "bound of the IPC kernels' waits in ms, below the group's timeout; 0: that timeout");
#ifdef QCOMM_EXPERIMENTS
  integer("QCOMM_IPC_TILE_ELEMS", S::kGroup, "4096", 1024, 65536, true,
          "a power of two from 1024 to 65536", "elements per tile of the fused kernel");
  integer("QCOMM_IPC_TASK_WARPS", S::kGroup, "8", 1, 8, true, "1, 2, 4 or 8",
          "warps per task group of the fused kernel");
  boolean("QCOMM_IPC_PROFILE", S::kGroup, "0", "count the fused kernel's cycles per phase");
#endif

  // CUDA codec launches (csrc/cuda/tuning.h): the measured defaults, or a forced shape.
  choice("QCOMM_CUDA_FULL_GRID", S::kProcess, "auto", {"auto", "0", "1"}, "auto, 0, 1",
         "codec kernels on the grid the work needs (1) or the resident grid (0)");
  choice("QCOMM_CUDA_ENCODE_BLOCKS", S::kProcess, "auto", {"auto", "3", "4"}, "auto, 3, 4",
         "encoder blocks per SM the kernels are compiled for");
  return d;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

[[noreturn]] void refuse(const Declaration& d, const std::string& raw) {
  std::string msg =
      std::string("qcomm: invalid ") + d.name + "='" + raw + "'; allowed: " + d.allowed;
  throw std::invalid_argument(msg);
}

bool parseInteger(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = 0;
  if (s[0] == '-' || s[0] == '+') i = 1;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j) {
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = int64_t(v);
  return true;
}

struct Cache {
  std::mutex mu;
  std::map<std::string, Value> values;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: read from exit handlers too
  return *c;
}

}  // namespace

const std::vector<Declaration>& declarations() {
  static const std::vector<Declaration> d = makeDeclarations();
  return d;
}

const Declaration& declaration(const std::string& name) {
  for (const Declaration& d : declarations()) {
    if (name == d.name) return d;
  }
  throw std::invalid_argument("qcomm: no setting named " + name);
}

Value parse(const std::string& name, const std::string& raw) {
  const Declaration& d = declaration(name);
  const std::string t = trim(raw);
  Value v;
  switch (d.kind) {
    case K::kChoice: {
      for (size_t i = 0; i < d.choices.size(); ++i) {
        if (lower(t) == lower(d.choices[i])) {
          v.text = d.choices[i];
          v.number = int64_t(i);
          return v;
        }
      }
      refuse(d, raw);
    }
    case K::kInteger: {
      int64_t n = 0;
      if (!parseInteger(t, &n) || n < d.minimum || n > d.maximum ||
          (d.powerOfTwo && (n & (n - 1)) != 0)) {
        refuse(d, raw);
      }
      v.text = std::to_string(n);
      v.number = n;
      return v;
    }
    case K::kBool: {
      const std::string l = lower(t);
      if (l == "1" || l == "true" || l == "yes" || l == "on") {
        v.text = "1";
        v.number = 1;
      } else if (l == "0" || l == "false" || l == "no" || l == "off") {
        v.text = "0";
        v.number = 0;
      } else {
        refuse(d, raw);
      }
      return v;
    }
    case K::kText:
      v.text = t;
      return v;
    case K::kBits: {
      const std::string l = lower(t);
      if (l == "4" || l == "8") {
        v.text = l;
        v.number = l == "4" ? 4 : 8;
      } else if (l == "none" || l == "0" || l.empty()) {
        v.text = "none";
        v.number = 0;
      } else {
        refuse(d, raw);
      }
      return v;
    }
  }
  refuse(d, raw);
}

Value get(const std::string& name) {
  const Declaration& d = declaration(name);
  Cache& c = cache();
  std::unique_lock<std::mutex> lock(c.mu, std::defer_lock);
  if (d.scope == Scope::kProcess) {
    lock.lock();
    auto it = c.values.find(name);
    if (it != c.values.end()) return it->second;
  }
  const char* env = std::getenv(d.name);  // the one place QCOMM_* settings are read
  Value v;
  if (env != nullptr && *env != '\0') {
    v = parse(name, env);
    v.fromEnvironment = true;
  } else {
    v = parse(name, d.defaultText);
  }
  if (d.scope == Scope::kProcess) c.values[name] = v;
  return v;
}

int64_t number(const std::string& name) { return get(name).number; }

std::string text(const std::string& name) { return get(name).text; }

void reload() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.values.clear();
}

}  // namespace settings
}  // namespace qcomm
