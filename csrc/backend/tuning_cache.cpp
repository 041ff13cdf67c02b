// The tuning cache file: its JSON and its replacement on disk (tuning_cache.h).
#include "backend/tuning_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "plan/config.h"
#include "plan/plan.h"

namespace qcomm {

const char* dtypeText(int32_t d) {
  return d == kFloat32 ? "float32" : d == kFloat16 ? "float16" : "bfloat16";
}

std::string jsonNumber(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.6g", v);
  return b;
}

std::string tuningCacheJson(const std::string& key, const std::vector<TuneEntry>& entries) {
  // format 2: each entry names its collective (qcomm/_tuning.py reads format 1 as allreduces)
  std::string out = "{\"format\": 2,\n \"key\": " + key + ",\n \"entries\": [";
  for (size_t i = 0; i < entries.size(); ++i) {
    const TuneEntry& e = entries[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{\"collective\": \"" +
           collectiveName(e.collective) + "\", \"dtype\": \"" + dtypeText(e.dtype) +
           "\", \"size_class\": " + std::to_string(e.sizeClass) +
           ", \"bytes\": " + std::to_string(e.bytes) + ", \"algorithm\": \"" +
           algoName(e.choice.algorithm) +
           "\", \"microshards\": " + std::to_string(e.choice.microshards) + ", \"seconds\": {";
    for (size_t j = 0; j < e.seconds.size(); ++j) {
      out += std::string(j ? ", " : "") + "\"" + choiceName(e.seconds[j].first) +
             "\": " + jsonNumber(e.seconds[j].second);
    }
    out += "}}";
  }
  out += "\n ]}\n";
  return out;
}

std::string replaceFile(const std::string& path, const std::string& out) {
  // written whole, then renamed over the old file: a reader never sees half a table. Only a
  // regular file (or none) is replaced: a device node, FIFO, symlink or directory at the path
  // (QCOMM_TUNE_FILE=/dev/null) is left alone; the temporary file is created afresh, never
  // opened through a link or a FIFO someone left there
  std::string why;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    why = "it is not a regular file";
  } else {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    ::unlink(tmp.c_str());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      why = std::strerror(errno);
    } else {
      size_t done = 0;
      while (done < out.size()) {
        const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
        if (n <= 0) break;
        done += size_t(n);
      }
      const bool ok = ::close(fd) == 0 && done == out.size();
      if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        why = std::strerror(errno);
        ::unlink(tmp.c_str());
      }
    }
  }
  return why;
}

}  // namespace qcomm
