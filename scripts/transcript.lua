-- scripts/transcript.lua — runs REPL input and prints it as a session transcript ("al> line", then
-- what the REPL printed), the form of docs/guide_*.md. Lines starting with "## " in the input become
-- headings between blocks (printed as "## ..." on their own).
--   scripts/attnlab scripts/transcript.lua session.lua > out.txt
local al = require "attnlab"
local repl = require "attnlab.repl"
local path = assert(arg[1], "usage: transcript.lua session.lua")
local f = assert(io.open(path))
local buf
for line in f:lines() do
  if not buf and line:match("^## ") then
    io.write(line, "\n")
  elseif not buf and line:match("^%s*$") then
    io.write("\n")
  else
    io.write(buf and "..> " or "al> ", line, "\n")
    io.stdout:flush()
    local chunk = buf and (buf .. "\n" .. line) or line
    local trimmed = chunk:match("^%s*(.-)%s*$")
    if trimmed:match("^%%time") then
      repl.time(trimmed:sub(6), al)
      buf = nil
    elseif trimmed:sub(1, 1) == "?" then
      io.write(repl.help(trimmed:sub(2), al) or "", "\n")
      buf = nil
    else
      local fn, err = repl.compile(chunk, "=stdin")
      if fn then
        buf = nil
        repl.run_chunk(fn, chunk:match(";%s*$") ~= nil, err)
      elseif err == "incomplete" then
        buf = chunk
      else
        buf = nil
        io.stdout:flush()
        io.write(err, "\n")
      end
    end
  end
  io.stdout:flush()
end
f:close()
