// Entry points of the `rewind` subcommands; each returns a process exit code (common/error.h).
#pragma once

namespace rwd::cli {

int run_store(int argc, char** argv);   // cli/cmd_store.cpp
int run_data(int argc, char** argv);    // cli/cmd_data.cpp
int run_train(int argc, char** argv);   // cli/cmd_train.cpp
int run_replay(int argc, char** argv);  // cli/cmd_replay.cpp
int run_step(int argc, char** argv);    // cli/cmd_step.cpp
int run_bisect(int argc, char** argv);  // cli/cmd_bisect.cpp
int run_import(int argc, char** argv);  // cli/cmd_import.cpp
int run_export(int argc, char** argv);  // cli/cmd_export.cpp
int run_doctor(int argc, char** argv);  // cli/cmd_doctor.cpp

}  // namespace rwd::cli
