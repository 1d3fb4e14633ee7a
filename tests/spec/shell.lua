-- tests/spec/shell.lua — small helpers for the specs that drive programs and files (install, bench
-- report, API docs, guides): shell quoting, running a command with its output and status, reading a
-- file. require "shell" after package.path has "tests/spec/?.lua".
local M = {}

-- s as one single-quoted shell word
function M.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- runs a shell command; returns its output (stdout and stderr together) and exit status
function M.sh(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\""))
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return out:gsub("__rc=%d+%s*$", ""), rc
end

-- a file's whole content, or nil when it cannot be opened
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

return M
