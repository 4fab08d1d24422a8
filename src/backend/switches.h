// Runtime switches: every EMBER_* environment variable the core reads, declared once in
// switch_table() with its fallback, allowed values and meaning, and read through a Switches
// snapshot taken when a backend (or a context) is made, never through getenv at the point of use.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace ember {

struct SwitchInfo {
    const char* name;       // "EMBER_..."
    const char* fallback;   // the value when neither an override nor the environment sets one
    const char* values;     // "0|1", "192|256|0", ...: the allowed values separated by '|'; "integer": n >= 0
    const char* meaning;    // one or two sentences for docs/switches.md and `python -m ember.switches`
};

// Every EMBER_* runtime switch, in the order docs/switches.md lists them.
const std::vector<SwitchInfo>& switch_table();
// The row of `name`; InvalidInput listing the known names for an unknown one.
const SwitchInfo& switch_info(const std::string& name);

// The values every switch has for one backend: overrides (set_switch) > environment > fallback.
// An empty environment variable counts as unset. Values are checked against the table when the
// snapshot is taken, so a bad one fails when the backend is made, naming the switch.
class Switches {
public:
    Switches();                  // every switch at its fallback (no environment, no override)
    static Switches current();   // snapshot taken when a backend is made
    const std::string& get(const std::string& name) const;   // InvalidInput for an unknown name
    bool on(const std::string& name) const;       // for 0/1 switches; InvalidInput naming the switch otherwise
    long integer(const std::string& name) const;  // InvalidInput naming the switch for a non-integer
    // A copy with one switch changed ("" restores its fallback); checked like set_switch.
    Switches with(const std::string& name, const std::string& value) const;

private:
    std::map<std::string, std::string> values_;
};

// Process-wide override, seen by every snapshot taken after it; "" clears it. InvalidInput for an
// unknown name (listing the known ones) or a value the switch does not take.
void set_switch(const std::string& name, const std::string& value);
// The override set_switch holds for `name` ("" where none).
std::string switch_override(const std::string& name);

}  // namespace ember
