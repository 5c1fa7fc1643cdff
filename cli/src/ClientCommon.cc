#include "ClientCommon.h"

namespace dsec::cli {

Result<std::unique_ptr<ApiClient>> connectFleet(const CommonOptions& common) {
  DSEC_ASSIGN_OR_RETURN(FleetAddress address, resolveFleet(common.fleet, common.fleet_given));
  return std::make_unique<ApiClient>(std::move(address));
}

std::string sandboxPath(const std::string& id) { return "/v1/sandboxes/" + urlEncode(id); }

}  // namespace dsec::cli
