--[[
tests/spec/summary.lua — busted output handler: plainTerminal's output (progress row, busted's status
line, then the pending/failure/error blocks), followed by one closing line that CI logs and
scripts/tally.sh read:

    N passed, N failed              (", N skipped" is added when some tests were pending)

Errors (a spec that raised, a file that failed to load, a describe that failed) count as failed.
Use: busted -o tests/spec/summary.lua   (or output = "tests/spec/summary.lua" in .busted)
--]]
return function(options)
    local busted = require "busted"
    local handler = require "busted.outputHandlers.plainTerminal"(options)

    -- One "FAIL <file>: <test name>: <first line of the message>" line per failed or erroring test, written
    -- just before the closing line: scripts/tally.sh repeats every FAIL line of a log above its total, so a
    -- CI log whose tail is all anyone sees still names what failed (a timing flake included).
    local failed_names = {}
    local function note_failure(element, parent, message)
        local name = handler.getFullName and handler.getFullName(element) or tostring(element.name)
        local file = element.trace and element.trace.short_src or "?"
        local first = tostring(message or ""):match("[^\n]*") or ""
        failed_names[#failed_names + 1] = string.format("FAIL %s: %s: %s", file, name, first)
        return nil, true
    end
    busted.subscribe({ "failure" }, note_failure)
    busted.subscribe({ "error" }, note_failure)

    -- Subscribed after plainTerminal's own suite-end handler, so this line comes last.
    busted.subscribe({ "suite", "end" }, function()
        if #failed_names > 0 then io.write("\n", table.concat(failed_names, "\n"), "\n") end
        local passed = handler.successesCount
        local failed = handler.failuresCount + handler.errorsCount
        local skipped = handler.pendingsCount
        local line = string.format("%d passed, %d failed", passed, failed)
        if skipped > 0 then line = line .. string.format(", %d skipped", skipped) end
        io.write("\n", line, "\n")
        io.flush()
        return nil, true
    end)

    return handler
end
