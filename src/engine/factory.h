// The device factory (factory.cpp): the backend EngineOptions ask for, loaded.
#pragma once

#include <flashmap/engine.h>

#include <memory>

#include "backend/backend.h"

namespace flashmap::engine {

// Checks the options (check_device), then loads the target and drafter on the device.
std::unique_ptr<Backend> make_backend(const EngineOptions& options);

}  // namespace flashmap::engine
