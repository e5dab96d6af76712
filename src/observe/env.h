// Integer knobs and on/off switches read from the environment. An integer knob has one rule for a
// value that is not one: a warning that names the variable, the value and the accepted range, then the
// default. (`atoi` read "8x" as 8 and "x" as 0, so a typo silently changed or dropped the setting.)
#pragma once

#include <cstdint>
#include <initializer_list>

namespace protean::observe {

/// The decimal integer in the environment variable `name` when it is set, non-empty, wholly a number
/// (surrounding spaces allowed) and within [lo, hi]; else `fallback`. A set value that is not such a
/// number warns once per variable and value through observe::warn ("W protean: NAME='8x' is not an
/// integer in [1, 64]; using 8"). Never throws.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi);

/// The switch `name`: "1", "true", "on", "yes" turn it on, "0", "false", "off", "no" off (any case);
/// unset or empty, `fallback`. Other text warns once per variable and value ("W protean:
/// NAME='maybe' is not a switch (0/1, true/false, on/off, yes/no); using 1") and is `fallback`.
/// (Before, any text but "0" was on for a default-on switch, so "=false" left it on.) Never throws.
bool env_switch(const char* name, bool fallback);
/// One of `allowed` when `name` is set to its decimal text; unset or empty, `fallback`; other text
/// warns once per variable and value ("W protean: NAME='3' is not one of 0, 2, 4; using 2") and is
/// `fallback`. Never throws.
int env_choice(const char* name, std::initializer_list<int> allowed, int fallback);
/// A switch that is on by default (env_switch(name, true)).
bool env_on(const char* name);
/// A switch that is off by default, opt-in (env_switch(name, false)).
bool env_opt_in(const char* name);

}  // namespace protean::observe
