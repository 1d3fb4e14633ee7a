-- Loaded by busted before the specs (see .busted): makes `al` reachable and detects the GPU once.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
_G.HAS_GPU = al.cuda.available() and true or false
