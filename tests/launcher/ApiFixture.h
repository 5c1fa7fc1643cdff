// Fixture for the node API tests: an EmbeddedNode on 127.0.0.1:0 over a temporary root holding a busybox
// layer "busybox:1", and a client for it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "HttpTestClient.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  launcher::ServeOptions options();
  // Starts (or restarts) the node on root_; returns false (with a test failure) if it cannot.
  bool startNode(const launcher::ServeOptions& options);
  void startNode() { ASSERT_TRUE(startNode(options())); }
  // Why sandboxes cannot be created here (not root, no layer, backend unavailable); "" when they can.
  std::string missingBackend();
  // POST /v1/sandboxes with the busybox image plus extra fields; returns the id or "" (with a failure).
  std::string createSandbox(const nlohmann::json& extra = nlohmann::json::object());
  HttpReply exec(const std::string& id, const nlohmann::json& body);
  std::string sandboxPath(const std::string& id, const std::string& rest = "") { return "/v1/sandboxes/" + id + rest; }

  std::unique_ptr<TempDir> root_;
  std::unique_ptr<launcher::EmbeddedNode> node_;
  std::unique_ptr<HttpTestClient> client_;
  std::string layer_error_;
};

}  // namespace dsec::testing

#define SKIP_WITHOUT_BACKEND()                         \
  do {                                                 \
    std::string dsec_why_ = missingBackend();          \
    if (!dsec_why_.empty()) GTEST_SKIP() << dsec_why_; \
  } while (0)
