// dsec call [options] (CODE | -f FILE | -): one stateless function call on the fleet's fncall backend
// (POST /v1/call). Prints the call's stdout and stderr and exits with its exit code, like `dsec exec`.
#include <unistd.h>

#include <iostream>
#include <iterator>

#include "ClientCommon.h"
#include "Commands.h"
#include "StreamExec.h"
#include "dsec/common/Base64.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

std::string readLocal(const std::string& option, const std::string& path) {
  auto text = readFile(path);
  if (!text.ok()) throw UsageError("--" + option + " " + path + ": " + text.error().message());
  return *text;
}

}  // namespace

int cmdCall(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("language", po::value<std::string>()->default_value("python"), "python | bash")(
      "code-file,f", po::value<std::string>(), "read the code from this local file")(
      "stdin", po::value<std::string>(), "text fed to the call's stdin")("stdin-file", po::value<std::string>(),
                                                                         "local file fed to the call's stdin")(
      "timeout", po::value<double>()->default_value(10), "seconds before the call is killed (at most 600)")(
      "memory", po::value<std::string>()->default_value("256M"), "memory limit of the call")(
      "file", po::value<std::vector<std::string>>()->composing(),
      "REL=LOCALPATH: place a local file at REL in the call's working directory (repeatable)")(
      "image", po::value<std::string>(), "image (default: the node's fncall image)")("output-cap", po::value<int64_t>(),
                                                                                     "bytes of output kept per stream")(
      "fresh-interpreter", "run the Python code in an interpreter started for this call (its own hash seed)")(
      "code", po::value<std::string>(), "the code, or - to read it from stdin");
  po::positional_options_description positional;
  positional.add("code", 1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional,
                        "[--language python|bash] [--stdin TEXT | --stdin-file F] [--timeout S] [--memory M] "
                        "[--file REL=LOCALPATH ...] [--image IMAGE] [--fresh-interpreter] (CODE | -f FILE | -)",
                        &vm, &common)) {
    return kExitOk;
  }
  std::vector<std::string> puts;
  if (vm.count("file") != 0) puts = vm["file"].as<std::vector<std::string>>();
  std::string code;
  if (vm.count("code-file") != 0 && vm.count("code") != 0) throw UsageError("give the code or -f FILE, not both");
  if (vm.count("code-file") != 0) {
    code = readLocal("code-file", vm["code-file"].as<std::string>());
  } else if (vm.count("code") != 0 && vm["code"].as<std::string>() == "-") {
    code.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else if (vm.count("code") != 0) {
    code = vm["code"].as<std::string>();
  } else {
    throw UsageError("missing code (dsec call CODE, dsec call -f FILE or dsec call - < FILE)");
  }
  if (code.empty()) throw UsageError("the code is empty");
  std::string language = vm["language"].as<std::string>();
  if (language != "python" && language != "bash") throw UsageError("--language must be python or bash");
  if (vm.count("stdin") != 0 && vm.count("stdin-file") != 0)
    throw UsageError("--stdin and --stdin-file exclude each other");
  double timeout = vm["timeout"].as<double>();
  if (!(timeout > 0) || timeout > 600) throw UsageError("--timeout must be in (0, 600] seconds");
  int64_t memory = parseSizeOption("memory", vm["memory"].as<std::string>());

  nlohmann::json body{{"code", code}, {"language", language}, {"timeout", timeout}, {"memory", memory}};
  if (vm.count("stdin") != 0) body["stdin_b64"] = base64Encode(vm["stdin"].as<std::string>());
  if (vm.count("stdin-file") != 0)
    body["stdin_b64"] = base64Encode(readLocal("stdin-file", vm["stdin-file"].as<std::string>()));
  if (!puts.empty()) {
    nlohmann::json files = nlohmann::json::object();
    for (const auto& [rel, local] : parseKeyValues("file", puts)) files[rel] = base64Encode(readLocal("file", local));
    body["files"] = files;
  }
  if (vm.count("image") != 0) body["image"] = vm["image"].as<std::string>();
  if (vm.count("fresh-interpreter") != 0) body["fresh_interpreter"] = true;
  if (vm.count("output-cap") != 0) {
    int64_t cap = vm["output-cap"].as<int64_t>();
    if (cap < 0) throw UsageError("--output-cap must be >= 0");
    body["output_cap"] = cap;
  }

  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  auto result = (*client)->call(HttpMethod::kPost, "/v1/call", body);
  if (!result.ok()) return reportError(inv, result.error());
  printAll(STDOUT_FILENO, result->value("stdout", ""));
  printAll(STDERR_FILENO, result->value("stderr", ""));
  if (result->value("truncated", false)) std::cerr << "dsec call: output was truncated at the output cap\n";
  return exitCodeOf(*result, inv.name);
}

}  // namespace dsec::cli
