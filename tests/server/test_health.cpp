// `flashmap serve` over an engine whose device faults (a sticky CUDA error, simulated on the CPU
// backend): the requests it held fail with the fault's message, /health answers 503 naming it,
// /metrics reports flashmap_engine_healthy 0, and the server stops by itself (the CLI then exits
// non-zero, for a supervisor or router to restart it) — no hang, no crash.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "../engine/faulty_backend.h"
#include "cpu/proposers.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "server/server.h"

using namespace flashmap;
using ::testing::HasSubstr;

TEST(Health, ADeviceFaultFailsRequestsAndStopsTheServer) {
  const std::string dir = "tests/fixtures/tiny-a";
  Qwen3Model target(dir + "/target");
  FlashMapModel draft(dir + "/draft", target);
  FlashMapProposer drafter(draft, 1);
  auto backend = std::make_unique<engine::test::FaultyBackend>(target, &drafter);
  auto* faulty = backend.get();
  faulty->fault_at = 1 << 30;  // healthy until the test says
  Engine engine(std::move(backend), {.max_running = 2, .spec_max_batch = 0});
  server::ServerOptions o;
  o.port = 0;
  o.fault_stop_delay_ms = 3000;
  server::Server srv(engine, nullptr, o);
  const int port = srv.bind();
  auto served = std::async(std::launch::async, [&] { srv.serve(); });

  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(30, 0);
  // (status, body); status 0 when no answer came.
  auto get = [&](const char* path) {
    auto r = cli.Get(path);
    return r ? std::pair(r->status, r->body) : std::pair(0, std::string());
  };
  const std::string body = R"({"prompt":[3,141,59],"max_tokens":20})";
  auto post = [&] {
    auto r = cli.Post("/v1/completions", body, "application/json");
    return r ? std::pair(r->status, r->body) : std::pair(0, std::string());
  };
  for (int i = 0; i < 100 && get("/health").first != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(get("/health").first, 200);
  auto [status, text] = post();
  EXPECT_EQ(status, 200) << text;

  faulty->fault_at = faulty->verifies.load();  // the next round faults
  std::tie(status, text) = post();
  EXPECT_EQ(status, 500);
  EXPECT_THAT(text, HasSubstr("illegal memory access"));
  std::tie(status, text) = get("/health");
  EXPECT_EQ(status, 503);
  EXPECT_THAT(text, HasSubstr("the device failed"));
  std::tie(status, text) = get("/metrics");
  EXPECT_EQ(status, 200);
  EXPECT_THAT(text, HasSubstr("\nflashmap_engine_healthy 0\n"));
  std::tie(status, text) = post();
  EXPECT_EQ(status, 503) << text;

  ASSERT_EQ(served.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the server did not stop after the device fault";
  EXPECT_TRUE(srv.stopped());
  EXPECT_THAT(srv.fault(), HasSubstr("cudaErrorIllegalAddress"));
  srv.stop();  // again: a no-op
}
