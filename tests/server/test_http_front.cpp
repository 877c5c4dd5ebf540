// The HTTP front's framing of a request's head (server/http_front.h: frame_request), without
// sockets: complete, incomplete, and each refusal, the same however the bytes were split into
// reads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "server/http_front.h"

namespace {

using flashmap::server::frame_request;
using flashmap::server::Framing;
using Kind = Framing::Kind;

constexpr size_t kHead = 64, kBody = 100;

Framing frame(const std::string& s) {
  return frame_request(s, kHead, kBody);
}

TEST(HttpFraming, CompleteRequests) {
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  Framing f = frame(get + "GET /next");  // a pipelined request after it
  EXPECT_EQ(f.kind, Kind::Complete);
  EXPECT_EQ(f.head_bytes, get.size());
  EXPECT_EQ(f.body_bytes, 0u);
  f = frame("POST /x HTTP/1.1\r\ncontent-length:  12 \r\n\r\n{");
  EXPECT_EQ(f.kind, Kind::Complete);  // the head is; the front waits for the body's 12 bytes
  EXPECT_EQ(f.body_bytes, 12u);
  f = frame("POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_TRUE(f.expect_continue);
  EXPECT_EQ(f.expect_at, 18u);
  EXPECT_EQ(f.expect_len, 22u);  // the line with its CRLF, removed before httplib reads the head
  EXPECT_EQ(frame("GET / HTTP/1.1\r\n").kind, Kind::Incomplete);
}

TEST(HttpFraming, Refusals) {
  auto status = [](const std::string& s) {
    const Framing f = frame(s);
    return f.kind == Kind::Refuse ? f.status : 0;
  };
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n"), 413);
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n"), 0);
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n"), 400);
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400);
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 1234567890123456789\r\n\r\n"), 400);
  EXPECT_EQ(status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 411);
  EXPECT_EQ(status(std::string(64, 'x')), 431);  // 64 bytes and no end yet: at least 65
  EXPECT_EQ(status(std::string(63, 'x')), 0);
  const Framing f = frame("POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n");
  EXPECT_EQ(f.body_bytes, 1000u);  // the front discards that much after its 413
  EXPECT_EQ(f.code, "request_too_large");
}

TEST(HttpFraming, AHeadOverTheLimitIsRefusedHoweverItArrives) {
  // 70 bytes of head: once refused when a read brought it whole (its end was found past the
  // limit) and refused otherwise only when 64 bytes came first, depending on the reads.
  const std::string head = "GET / HTTP/1.1\r\nX: " + std::string(47, 'a') + "\r\n\r\n";
  ASSERT_EQ(head.size(), 70u);
  EXPECT_EQ(frame(head).kind, Kind::Refuse);
  EXPECT_EQ(frame(head).status, 431);
  for (size_t n = 1; n < head.size(); ++n) {
    const Framing part = frame(head.substr(0, n));
    EXPECT_TRUE(part.kind == Kind::Incomplete || part.status == 431) << n;
  }
  // 64 bytes exactly is a head within the limit.
  const std::string fits = "GET / HTTP/1.1\r\nX: " + std::string(41, 'a') + "\r\n\r\n";
  ASSERT_EQ(fits.size(), 64u);
  EXPECT_EQ(frame(fits).kind, Kind::Complete);
  for (size_t n = 1; n < fits.size(); ++n) EXPECT_EQ(frame(fits.substr(0, n)).kind, Kind::Incomplete);
}

}  // namespace
