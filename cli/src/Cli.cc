#include "Cli.h"

#include <cstdlib>
#include <iostream>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {

std::string defaultRoot() {
  const char* env = std::getenv("DSEC_ROOT");
  return env != nullptr && *env != '\0' ? env : "/var/lib/dsec";
}

void addCommonOptions(po::options_description& desc, CommonOptions* common, bool with_fleet) {
  desc.add_options()("help,h", "print this help")("root",
                                                  po::value<std::string>(&common->root)->default_value(defaultRoot()),
                                                  "dsec root: layer store, state, token (env DSEC_ROOT)")(
      "log-level", po::value<std::string>(&common->log_level)->default_value("warn"), "debug|info|warn|error");
  if (with_fleet) {
    desc.add_options()("fleet", po::value<std::string>(&common->fleet)->default_value("default"),
                       "fleet name: ~/.dsec/fleets/NAME.json (DSEC_ENDPOINT/DSEC_TOKEN win unless given)")(
        "connect-timeout", po::value<double>(&common->connect_timeout)->default_value(10),
        "seconds to wait for a connection to the fleet")(
        "request-timeout", po::value<double>(&common->request_timeout)->default_value(300),
        "seconds a request may wait for its answer without a byte (0 = no limit; exec: its --timeout + 30)");
  }
}

bool parseCommandLine(const Invocation& inv, const std::vector<std::string>& args, const po::options_description& desc,
                      const po::positional_options_description& positional, const std::string& synopsis,
                      po::variables_map* vm, CommonOptions* common) {
  std::vector<std::string> all = inv.globals;
  all.insert(all.end(), args.begin(), args.end());
  try {
    po::store(po::command_line_parser(all).options(desc).positional(positional).run(), *vm);
    if (vm->count("help") != 0) {
      std::cout << "usage: dsec " << inv.name << " " << synopsis << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(*vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  if (common != nullptr) {
    LogLevel level;
    if (!parseLogLevel(common->log_level, &level)) {
      throw UsageError("unknown --log-level '" + common->log_level + "' (debug|info|warn|error)");
    }
    setLogLevel(level);
    if (vm->count("fleet") != 0) common->fleet_given = !(*vm)["fleet"].defaulted();
  }
  return true;
}

std::pair<std::vector<std::string>, std::vector<std::string>> splitAtDoubleDash(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      return {std::vector<std::string>(args.begin(), args.begin() + static_cast<long>(i)),
              std::vector<std::string>(args.begin() + static_cast<long>(i) + 1, args.end())};
    }
  }
  return {args, {}};
}

int64_t parseSizeOption(const std::string& option, const std::string& text) {
  auto bytes = parseByteSize(text);
  if (!bytes.ok()) throw UsageError("--" + option + ": " + bytes.error().message());
  return *bytes;
}

std::map<std::string, std::string> parseKeyValues(const std::string& option, const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError("--" + option + " wants KEY=VALUE, got '" + item + "'");
    }
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

int reportError(const Invocation& inv, const std::string& message) {
  std::cerr << "dsec " << inv.name << ": " << message << "\n";
  return kExitFailure;
}

int reportError(const Invocation& inv, const Error& error) { return reportError(inv, error.message()); }

}  // namespace dsec::cli
