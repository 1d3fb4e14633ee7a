-- Lets `require "attnlab"` work from the repository root without installing: puts lua/ on the
-- module path and loads lua/attnlab/init.lua.
local dir = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "."
package.path = dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;" .. package.path
package.loaded["attnlab"] = nil
return dofile(dir .. "/lua/attnlab/init.lua")
