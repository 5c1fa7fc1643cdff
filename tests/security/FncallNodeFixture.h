// Fixture for attacks on function calls through a real node: an EmbeddedNode (what `dsec serve` runs) on
// 127.0.0.1:0 over a temporary root holding a Python layer built from the host's python3.11
// (tests/backends/fncall/PythonTestImage.h), and an HTTP client. Attacks are sent to POST /v1/call exactly
// as a client would send them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "HttpTestClient.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {

class FncallNodeAttack : public ::testing::Test {
 protected:
  static constexpr const char* kImage = "pyattack:1";
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;
  void TearDown() override;

  // One worker by default: every call lands on the same worker as the one before it.
  launcher::ServeOptions options();
  void start(const launcher::ServeOptions& options);
  void start() { start(options()); }
  // POST /v1/call; the reply (any status).
  HttpReply post(const nlohmann::json& body);
  // POST /v1/call that must be answered 200; its JSON body.
  nlohmann::json call(const nlohmann::json& body);

  static inline std::string skip_;
  static inline std::string setup_error_;
  static inline TempDir* rootfs_dir_ = nullptr;
  std::unique_ptr<TempDir> root_;
  std::unique_ptr<launcher::EmbeddedNode> node_;
  std::unique_ptr<HttpTestClient> client_;
};

}  // namespace dsec::testing
