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

    -- Subscribed after plainTerminal's own suite-end handler, so this line comes last.
    busted.subscribe({ "suite", "end" }, function()
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
