@echo off
rem HalfSafe for Windows: double-click. The first start sets everything up (a few minutes,
rem progress in this window); later starts open the app at once. The console closes once the
rem window is up. Arguments go on to the halfsafe command: HalfSafe.cmd check demo
setlocal
set "HALFSAFE_LAUNCHER=%~f0"
set "CHECK=import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)"
set PY=
if defined HALFSAFE_PYTHON (
  "%HALFSAFE_PYTHON%" -c "%CHECK%" >nul 2>nul && set PY="%HALFSAFE_PYTHON%"
)
rem The py launcher finds the newest installed Python; "python" may be the Microsoft Store
rem placeholder, which fails the version check and is skipped.
for %%C in ("py -3" "python" "python3") do (
  if not defined PY (
    %%~C -c "%CHECK%" >nul 2>nul && set "PY=%%~C"
  )
)
if not defined PY (
  echo HalfSafe needs Python 3.10 or newer and none was found: install it from https://www.python.org/downloads/windows/ ^(tick "Add python.exe to PATH"^), then double-click HalfSafe.cmd again.
  pause
  exit /b 3
)
%PY% "%~dp0bootstrap.py" --detach %*
set "STATUS=%ERRORLEVEL%"
rem Started by double-click with a problem: keep the window open so the message can be read.
if not "%STATUS%"=="0" if "%~1"=="" pause
exit /b %STATUS%
