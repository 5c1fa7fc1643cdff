// POST /run_code in the node core (RunCode.h): python and bash on the fncall workers, cpp in a fresh container
// sandbox of its own.
#include "dsec/launcher/node/RunCode.h"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/common/Base64.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "run_code";
using backends::ExecResult;
using nlohmann::json;

constexpr int64_t kRunOutputCap = 16LL << 20;  // per stream, of the program's own output
// With fetch_files the trailer (the files in base64) shares stdout with the program's output.
constexpr int64_t kFetchOutputCap = kRunOutputCap + 4 * static_cast<int64_t>(kMaxFetchBytes) / 3 + (1 << 20);
// The fetch driver gets this long beyond run_timeout to read and send the files.
constexpr double kFetchGraceSeconds = 5;
// The cpp sandbox's own deadline beyond compile + run: the node's reaper destroys it even if this process
// could not (it is destroyed as soon as the run is over otherwise).
constexpr double kCppSandboxSlackSeconds = 120;
constexpr const char* kCppWorkDir = "/work/run";  // the working directory; files go here
constexpr const char* kCppBuildDir = "/work/.dsec-build";
constexpr const char* kBeginMarker =
    "\x1e"
    "dsec-run-code-begin-";
constexpr const char* kEndMarker =
    "\x1e"
    "dsec-run-code-end-";

CommandOutcome outcomeOf(const ExecResult& r) {
  CommandOutcome o;
  o.execution_time = r.duration_seconds;
  o.stdout_data = r.stdout_data;
  o.stderr_data = r.stderr_data;
  if (r.timed_out) {
    o.status = CommandStatus::kTimeLimitExceeded;  // SandboxFusion has no return code after a time limit
  } else {
    o.status = CommandStatus::kFinished;
    o.return_code = r.signal != 0 ? -r.signal : r.exit_code;
  }
  return o;
}

CommandOutcome errorOutcome(const Error& e) {
  CommandOutcome o;
  o.status = CommandStatus::kError;
  o.stderr_data = e.message();
  return o;
}

// ---- python and bash: the fncall workers ------------------------------------------------------------------------

Result<RunCodeResult> runOnFncall(NodeAgent& agent, const RunCodeRequest& request) {
  NodeFncall* fncall = agent.fncall();
  if (fncall == nullptr) {
    return Error(ErrorCode::kUnsupported, "run_code for " + std::string(runLanguageName(request.language)) +
                                              " needs fncall, which is not available on node " +
                                              agent.options().node_name + ": " + agent.fncallUnavailableReason());
  }
  backends::fncall::CallRequest call;
  call.stdin_data = request.stdin_data;
  call.memory_bytes = request.memory_bytes;
  call.files = request.files;
  RunCodeResult result;
  if (request.fetch_files.empty()) {
    call.language = request.language == RunLanguage::kBash ? backends::fncall::Language::kBash
                                                           : backends::fncall::Language::kPython;
    call.code = request.code;
    call.timeout_seconds = request.run_timeout;
    call.output_cap = kRunOutputCap;
    DSEC_ASSIGN_OR_RETURN(ExecResult r, fncall->call(std::move(call)));
    result.run = outcomeOf(r);
    return result;
  }
  // The driver (fetchDriverSource) runs the program as its child and reads the files back before the call ends.
  // The nonce marks the driver's report on the stdout it shares with the program: nothing the program can see may
  // name it (a program that knew it could print a report of its own and kill the driver), so the program's file
  // has a name of its own, and the spec naming the nonce is gone before the program starts.
  const std::string nonce = randomHex(32);
  const bool python = request.language == RunLanguage::kPython;
  const std::string main = ".dsec-run-" + randomHex(32) + (python ? ".py" : ".sh");
  json spec{{"main", main},
            {"language", runLanguageName(request.language)},
            {"timeout", request.run_timeout},
            {"fetch", request.fetch_files},
            {"limit", kMaxFetchBytes}};
  call.files[main] = request.code;
  call.files[".dsec-run-" + nonce + ".json"] = spec.dump();
  call.language = backends::fncall::Language::kPython;
  call.code = fetchDriverSource(nonce);
  call.timeout_seconds = std::min(backends::fncall::kMaxTimeoutSeconds, request.run_timeout + kFetchGraceSeconds);
  call.output_cap = kFetchOutputCap;
  DSEC_ASSIGN_OR_RETURN(ExecResult r, fncall->call(std::move(call)));
  FetchTrailer trailer = parseFetchTrailer(r.stdout_data, nonce);
  CommandOutcome run;
  run.stderr_data = std::move(r.stderr_data);
  run.stdout_data = trailer.found ? std::move(trailer.program_stdout) : std::move(r.stdout_data);
  run.execution_time = trailer.found ? trailer.execution_time : r.duration_seconds;
  if (trailer.found && !trailer.error.empty()) return Error::invalid("fetch_files: " + trailer.error);
  // No report: the worker's own deadline came first, or the program's memory use killed the driver too (both the
  // program's doing); anything else is the platform's.
  if (!trailer.found && !r.timed_out && !r.oom_killed) {
    std::string why = r.truncated
                          ? "the program's output went over the output cap"
                          : "the fetch driver ended without reporting (exit " + std::to_string(r.exit_code) + ")";
    return Error(ErrorCode::kInternal, "run_code: fetch_files: " + why);
  }
  if (trailer.found ? trailer.time_limit_exceeded : r.timed_out) {
    run.status = CommandStatus::kTimeLimitExceeded;
  } else {
    run.status = CommandStatus::kFinished;
    run.return_code = trailer.found ? trailer.return_code : std::optional<int>(r.signal != 0 ? -r.signal : r.exit_code);
  }
  result.run = std::move(run);
  result.files = std::move(trailer.files);
  return result;
}

// ---- cpp: a fresh container sandbox ---------------------------------------------------------------------------

// Destroys the run's sandbox however the run ends.
class SandboxGuard {
 public:
  SandboxGuard(NodeAgent& agent, std::string id) : agent_(agent), id_(std::move(id)) {}
  ~SandboxGuard() {
    if (auto st = agent_.destroy(id_, "run_code done"); !st.ok()) {
      DSEC_LOG(kWarn, kLog) << "destroying " << id_ << ": " << st.error().toString();
    }
  }
  SandboxGuard(const SandboxGuard&) = delete;
  SandboxGuard& operator=(const SandboxGuard&) = delete;

 private:
  NodeAgent& agent_;
  std::string id_;
};

Status writeSandboxFile(backends::Sandbox& sandbox, const std::string& path, std::string_view bytes) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, sandbox.openForWrite(path, 0644));
  return writeAll(fd.get(), bytes, path);
}

// A regular file's bytes, at most `limit` (nullopt: not there or not a regular file).
Result<std::optional<std::string>> readSandboxFile(backends::Sandbox& sandbox, const std::string& path, size_t limit) {
  auto st = sandbox.stat(path);
  if (!st.ok() || st->type != "file") return std::optional<std::string>();
  auto fd = sandbox.openForRead(path);
  if (!fd.ok()) return std::optional<std::string>();
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd->get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "read " + path);
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > limit)
      return Error::invalid("fetch_files: more than " + formatBytes(kMaxFetchBytes) + " together");
  }
  return std::optional<std::string>(std::move(data));
}

Result<RunCodeResult> runCpp(NodeAgent& agent, const RunCodeOptions& options, const RunCodeRequest& request) {
  CreateParams params;
  auto layers = fs3::parseImageRef(options.cpp_image);
  if (!layers.ok()) return layers.error().wrap("the node's run_code cpp image");
  params.layers = *layers;
  params.image = fs3::imageToString(*layers);
  params.memory_bytes = request.memory_bytes;
  params.timeout = request.compile_timeout + request.run_timeout + kCppSandboxSlackSeconds;
  params.labels = {{"dsec.run_code", "cpp"}};
  auto info = agent.create(params);
  if (!info.ok()) {
    if (info.error().code() == ErrorCode::kNotFound) {
      return Error::notFound("run_code cpp: " + info.error().message() +
                             " (the image must have g++: e.g. `dsec layer " +
                             "build gcc:12 --on debian:12 --run 'apt-get update && apt-get install -y g++'`, or name " +
                             "another with --run-code-cpp-image)");
    }
    return info.error();
  }
  SandboxGuard guard(agent, info->id);
  DSEC_ASSIGN_OR_RETURN(SandboxLease lease, agent.use(info->id));
  backends::Sandbox& sandbox = lease.sandbox();

  const std::string work = kCppWorkDir, build = kCppBuildDir;
  std::set<std::string> dirs = {work, build};
  for (const auto& [path, bytes] : request.files) {
    (void)bytes;
    if (size_t slash = path.rfind('/'); slash != std::string::npos) dirs.insert(work + "/" + path.substr(0, slash));
  }
  backends::ExecRequest mkdir;
  mkdir.argv = {"mkdir", "-p"};
  mkdir.argv.insert(mkdir.argv.end(), dirs.begin(), dirs.end());
  mkdir.timeout_seconds = 30;
  DSEC_ASSIGN_OR_RETURN(ExecResult made, sandbox.exec(mkdir));
  if (made.exit_code != 0) return Error::internal("run_code cpp: mkdir in the sandbox failed: " + made.stderr_data);
  for (const auto& [path, bytes] : request.files) DSEC_TRY(writeSandboxFile(sandbox, work + "/" + path, bytes));
  DSEC_TRY(writeSandboxFile(sandbox, build + "/main.cpp", request.code));

  RunCodeResult result;
  backends::ExecRequest compile;
  compile.argv = {"g++", "-std=c++17", "-o", build + "/main", build + "/main.cpp"};
  compile.cwd = work;
  compile.timeout_seconds = request.compile_timeout;
  compile.output_cap = kRunOutputCap;
  auto compiled = sandbox.exec(compile);
  result.compile = compiled.ok() ? outcomeOf(*compiled) : errorOutcome(compiled.error());
  if (result.compile->status != CommandStatus::kFinished || result.compile->return_code != 0) return result;

  backends::ExecRequest run;
  run.argv = {build + "/main"};
  run.cwd = work;
  run.stdin_data = request.stdin_data;
  run.timeout_seconds = request.run_timeout;
  run.output_cap = kRunOutputCap;
  auto ran = sandbox.exec(run);
  result.run = ran.ok() ? outcomeOf(*ran) : errorOutcome(ran.error());

  size_t fetched = 0;
  for (const auto& path : request.fetch_files) {
    DSEC_ASSIGN_OR_RETURN(auto bytes, readSandboxFile(sandbox, work + "/" + path, kMaxFetchBytes - fetched));
    if (!bytes) continue;
    fetched += bytes->size();
    result.files[path] = std::move(*bytes);
  }
  return result;
}

}  // namespace

const char* runLanguageName(RunLanguage language) {
  switch (language) {
    case RunLanguage::kPython:
      return "python";
    case RunLanguage::kBash:
      return "bash";
    case RunLanguage::kCpp:
      return "cpp";
  }
  return "?";
}

const char* commandStatusName(CommandStatus status) {
  switch (status) {
    case CommandStatus::kFinished:
      return "Finished";
    case CommandStatus::kTimeLimitExceeded:
      return "TimeLimitExceeded";
    case CommandStatus::kError:
      return "Error";
  }
  return "Error";
}

Result<RunCodeResult> runCode(NodeAgent& agent, const RunCodeOptions& options, const RunCodeRequest& request) {
  if (request.language == RunLanguage::kCpp) return runCpp(agent, options, request);
  return runOnFncall(agent, request);
}

std::string fetchDriverSource(const std::string& nonce) {
  // The nonce is hex (randomHex): it goes into the source as it is. The program runs in its own session so that
  // the time limit kills all of it; the driver, like the program, runs as the call's unprivileged user.
  return "import base64, json, os, signal, stat, subprocess, sys, time\n"
         // Not dumpable: the program (its child, of the same uid) cannot read the nonce from its memory.
         "try:\n"
         "    import ctypes\n"
         "    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
         "except Exception:\n"
         "    pass\n"
         "N = '" +
         nonce +
         "'\n"
         "spec_path = '.dsec-run-' + N + '.json'\n"
         "with open(spec_path) as f:\n"
         "    spec = json.load(f)\n"
         "os.unlink(spec_path)\n"
         "if spec['language'] == 'python':\n"
         "    argv = [sys.executable, spec['main']]\n"
         "else:\n"
         "    argv = ['bash' if os.path.exists('/bin/bash') else 'sh', spec['main']]\n"
         "t0 = time.monotonic()\n"
         "rc, tle = None, False\n"
         "p = subprocess.Popen(argv, start_new_session=True)\n"
         "try:\n"
         "    rc = p.wait(timeout=spec['timeout'])\n"
         "except subprocess.TimeoutExpired:\n"
         "    tle = True\n"
         "    try:\n"
         "        os.killpg(p.pid, signal.SIGKILL)\n"
         "    except OSError:\n"
         "        pass\n"
         "    p.wait()\n"
         "elapsed = time.monotonic() - t0\n"
         "files, total, error = {}, 0, ''\n"
         "for path in spec['fetch']:\n"
         "    try:\n"
         "        if not stat.S_ISREG(os.stat(path).st_mode):\n"
         "            continue\n"
         "        with open(path, 'rb') as f:\n"
         "            data = f.read(spec['limit'] - total + 1)\n"
         "    except OSError:\n"
         "        continue\n"
         "    total += len(data)\n"
         "    if total > spec['limit']:\n"
         "        error = 'more than %d bytes together' % spec['limit']\n"
         "        break\n"
         "    files[path] = base64.b64encode(data).decode()\n"
         "out = json.dumps({'rc': rc, 'tle': tle, 'time': elapsed, 'files': files, 'error': error})\n"
         "data = ('" +
         std::string("\\x1edsec-run-code-begin-") + "' + N + out + '" + std::string("\\x1edsec-run-code-end-") +
         "' + N).encode()\n"
         "while data:\n"
         "    data = data[os.write(1, data):]\n";
}

FetchTrailer parseFetchTrailer(std::string_view out, const std::string& nonce) {
  FetchTrailer t;
  const std::string begin = kBeginMarker + nonce, end = kEndMarker + nonce;
  size_t b = out.rfind(begin);
  if (b == std::string_view::npos) return t;
  size_t e = out.find(end, b + begin.size());
  if (e == std::string_view::npos) return t;
  t.found = true;
  // What a background process of the program printed after the trailer is still the program's output.
  t.program_stdout = std::string(out.substr(0, b)) + std::string(out.substr(e + end.size()));
  json j = json::parse(out.substr(b + begin.size(), e - b - begin.size()), nullptr, false);
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object()) {
    t.error = "the fetch driver's report is malformed";
    return t;
  }
  if (j.contains("error") && j["error"].is_string() && !j["error"].get<std::string>().empty()) {
    t.error = j["error"].get<std::string>();
    return t;
  }
  t.time_limit_exceeded = j.value("tle", false);
  if (j.contains("rc") && j["rc"].is_number_integer()) t.return_code = j["rc"].get<int>();
  if (j.contains("time") && j["time"].is_number()) t.execution_time = j["time"].get<double>();
  for (const auto& [path, b64] : j["files"].items()) {
    if (!b64.is_string()) {
      t.error = "the fetch driver's report is malformed";
      return t;
    }
    auto bytes = base64Decode(b64.get<std::string>());
    if (!bytes.ok()) {
      t.error = "the fetch driver's report is malformed: " + bytes.error().message();
      return t;
    }
    t.files[path] = std::move(*bytes);
  }
  return t;
}

}  // namespace dsec::launcher
