--[[
examples/train_copy_task.lua — a two-layer attention model learns to copy.

  luajit examples/train_copy_task.lua                   -- CPU, 150 steps, loss printed as it falls
  luajit examples/train_copy_task.lua --device cuda --steps 500 --lr 3e-3 --seed 1
  (or: ATTNLAB_LIBDIR=... LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit examples/train_copy_task.lua)

The task: n random symbols, a separator, then the same n symbols again; the model reads the
sequence left to right (causal attention) and must predict each symbol of the copy. Chance is
log(V) nats; a model that copies drives the loss towards 0. The copy sits a fixed distance back, so
rotary position embeddings make it learnable: query and key projections (with bias) learn to score
the relative offset n + 1.

Model (bshd, pre-norm): one-hot -> Linear(V+1, H, no bias) -> 2 x [x + MultiheadAttention(x)
(input_layernorm, RoPE, causal)] -> LayerNorm -> Linear(H, V+1) -> cross-entropy on the copied
half. Trained with al.optim.Adam. Everything runs on --device (cpu by default; cuda uses the same
code, the math ops and attention dispatching to the CUDA plugin).

Required as a module (require/dofile), it returns run(opts) -> losses (a list, one per step), so a
spec can train a few steps: run{steps = 30, print = false}.
]]
local function run(opts)
  opts = opts or {}
  local al = opts.al or require "attnlab"
  local device = opts.device or "cpu"
  local steps = opts.steps or 150
  local V, n, H, heads, B = opts.vocab or 8, opts.n or 6, opts.hidden or 32, opts.heads or 4, opts.batch or 16
  local lr = opts.lr or 3e-3
  local say = opts.print == false and function() end or function(...) print(string.format(...)) end
  local NT = V + 1                 -- symbols 1..V, separator V+1
  local S = 2 * n + 1              -- n symbols, separator, n copied symbols
  local L = S - 1                  -- inputs: tokens 1..S-1; targets: tokens 2..S
  al.manual_seed(opts.seed or 1)
  local o = { device = device }

  local embed = al.nn.Linear{ in_features = NT, out_features = H, bias = false, device = device }
  local layers = {}
  for i = 1, 2 do
    layers[i] = al.nn.MultiheadAttention{ hidden_size = H, num_attention_heads = heads, qkv_format = "bshd",
      input_layernorm = true, rotary = true, attn_mask_type = "causal", attention_dropout = 0, layer_number = i,
      device = device }
  end
  local final_ln = al.nn.LayerNorm{ normalized_shape = H, device = device }
  local head = al.nn.Linear{ in_features = H, out_features = NT, device = device }
  local modules = { embed, layers[1], layers[2], final_ln, head }
  local params, grads = {}, {}
  for _, m in ipairs(modules) do
    local p, g = m:parameters()
    for i = 1, #p do params[#params + 1] = p[i]; grads[#grads + 1] = g[i] end
  end
  local opt = al.optim.Adam(params, grads, { lr = lr })

  -- a batch: one-hot inputs [B, L, NT] and the target symbol of every position (0 = not scored)
  local rng = opts.rng or math.random
  if opts.seed then math.randomseed(opts.seed) end
  local function batch()
    local onehot, target = {}, {}
    for b = 1, B do
      local seq = {}
      for i = 1, n do seq[i] = rng(1, V) end
      seq[n + 1] = NT
      for i = 1, n do seq[n + 1 + i] = seq[i] end
      for p = 1, L do
        for c = 1, NT do onehot[#onehot + 1] = (c == seq[p]) and 1 or 0 end
        target[(b - 1) * L + p] = p >= n + 1 and seq[p + 1] or 0
      end
    end
    return al.tensor(onehot, o):view(B, L, NT), target
  end

  local losses = {}
  local t0 = os.clock()
  for step = 1, steps do
    local x0, target = batch()
    for _, m in ipairs(modules) do m:zero_grad() end
    -- forward
    local e = embed:forward(x0)
    local h1 = e + layers[1]:forward(e)
    local h2 = h1 + layers[2]:forward(h1)
    local z = final_ln:forward(h2)
    local logits = head:forward(z)
    local logp = logits:log_softmax(-1):flat_values()
    -- cross-entropy over the scored positions; dlogits = (softmax - onehot) / count
    local loss, count = 0, 0
    for i = 1, B * L do if target[i] ~= 0 then count = count + 1 end end
    local dl = {}
    for i = 1, B * L do
      local tg = target[i]
      for c = 1, NT do
        local k = (i - 1) * NT + c
        if tg ~= 0 then
          dl[k] = (math.exp(logp[k]) - (c == tg and 1 or 0)) / count
          if c == tg then loss = loss - logp[k] end
        else
          dl[k] = 0
        end
      end
    end
    loss = loss / count
    losses[step] = loss
    -- backward
    local dlogits = al.tensor(dl, { dtype = logits:dtype(), device = device }):view(B, L, NT)
    local dz = head:backward(z, dlogits)
    local dh2 = final_ln:backward(h2, dz)
    local dh1 = dh2 + layers[2]:backward(h1, dh2)
    local de = dh1 + layers[1]:backward(e, dh1)
    embed:backward(x0, de)
    opt:step()
    if step == 1 or step % (opts.every or 20) == 0 or step == steps then
      say("step %4d  loss %.4f  (chance %.4f)  %.1fs cpu", step, loss, math.log(V), os.clock() - t0)
    end
  end
  return losses
end

-- run as a script (not required/dofile'd): parse --device, --steps, --lr, --seed
if not pcall(debug.getlocal, 4, 1) then
  local opts = {}
  local a = { ... }
  local i = 1
  while i <= #a do
    local k, v = a[i], a[i + 1]
    if k == "--device" then opts.device = v
    elseif k == "--steps" then opts.steps = tonumber(v)
    elseif k == "--lr" then opts.lr = tonumber(v)
    elseif k == "--seed" then opts.seed = tonumber(v)
    else error("train_copy_task: unknown argument " .. tostring(k) .. " (expected --device, --steps, --lr, --seed)") end
    i = i + 2
  end
  package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
  opts.seed = opts.seed or 1
  local losses = run(opts)
  print(string.format("loss %.4f -> %.4f over %d steps", losses[1], losses[#losses], #losses))
end

return run
