#include "ClientCommon.h"

#include "dsec/common/Strings.h"

namespace dsec::cli {

Result<std::unique_ptr<ApiClient>> connectFleet(const CommonOptions& common) {
  if (!(common.connect_timeout > 0) || !(common.request_timeout >= 0)) {
    return Error::invalid("--connect-timeout must be > 0 and --request-timeout >= 0 seconds");
  }
  DSEC_ASSIGN_OR_RETURN(FleetAddress address, resolveFleet(common.fleet, common.fleet_given));
  auto client = std::make_unique<ApiClient>(std::move(address));
  client->setTimeouts(common.connect_timeout, common.request_timeout);
  return client;
}

std::string sandboxPath(const std::string& id) { return "/v1/sandboxes/" + percentEncode(id); }

}  // namespace dsec::cli
