// What every `dsec` subcommand shares: how it is invoked, the common options, usage errors (exit 2) versus
// runtime errors (exit 1), and small argument parsers (sizes, K=V lists).
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::cli {

namespace po = boost::program_options;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// One subcommand call: name as the user typed it ("run", "layer build"), the arguments after it, and the global
// options given before the subcommand (parsed as if given after it).
struct Invocation {
  std::string name;
  std::vector<std::string> globals;
  std::vector<std::string> args;
};

// A malformed command line: main prints "dsec <cmd>: <message>" and a hint, and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommonOptions {
  std::string root;   // --root, default $DSEC_ROOT or /var/lib/dsec
  std::string fleet;  // --fleet (client commands only), default "default"
  bool fleet_given = false;
  std::string log_level;  // --log-level
  // Client commands: --connect-timeout and --request-timeout (seconds; a request that gets no answer byte for
  // that long fails; 0: none). A streamed exec waits as long as its own --timeout plus a grace instead.
  double connect_timeout = 10;
  double request_timeout = 300;
};

std::string defaultRoot();

// Adds --help, --root, --log-level and (for client commands) --fleet to desc.
void addCommonOptions(po::options_description& desc, CommonOptions* common, bool with_fleet);

// Parses inv.globals + args against desc (and positionals); applies --log-level. Returns false when --help was given
// (usage already printed to stdout). Throws UsageError for unknown options, missing values and the like.
bool parseCommandLine(const Invocation& inv, const std::vector<std::string>& args, const po::options_description& desc,
                      const po::positional_options_description& positional, const std::string& synopsis,
                      po::variables_map* vm, CommonOptions* common);

// Splits at the first "--": the options before, the command after.
std::pair<std::vector<std::string>, std::vector<std::string>> splitAtDoubleDash(const std::vector<std::string>& args);

// "512M" -> bytes; throws UsageError naming the option on garbage.
int64_t parseSizeOption(const std::string& option, const std::string& text);
// ["K=V", ...] -> map; throws UsageError naming the option on an entry without '=' or an empty key.
std::map<std::string, std::string> parseKeyValues(const std::string& option, const std::vector<std::string>& items);

// Prints "dsec <cmd>: <message>" to stderr and returns kExitFailure.
int reportError(const Invocation& inv, const Error& error);
int reportError(const Invocation& inv, const std::string& message);

}  // namespace dsec::cli
